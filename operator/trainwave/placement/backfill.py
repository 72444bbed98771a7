"""Shadow times for the queue's backfill onto held room (queueing.py rule 9). Pure.

A protected gang holds every node it could use (rule 3). Its *shadow time* is the earliest
moment its room would be complete if every gang on those nodes ended at its own bound
(runPolicy.maxRunSeconds from its release, which the operator enforces). A gang that is
gone by then cannot delay it, whatever nodes it takes: that is Slurm's backfill with time
limits (EASY backfill). Whatever has no bound never ends in this count, so a protected gang
among unbounded gangs has no shadow time and keeps its whole hold.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from trainwave.placement.gang_types import GangRequest
from trainwave.placement.requirements import PodNeeds
from trainwave.placement.snapshot import ClusterSnapshot


@dataclass(frozen=True)
class BoundedGang:
    """A whole-GPU gang holding resources that is stopped by `end` (seconds since the
    epoch): runPolicy.maxRunSeconds from its release."""

    end: float
    needs: PodNeeds  # one worker's pod
    workers_by_node: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class RunBounds:
    """What rule 9 knows of the running gangs' ends. Whatever is not listed here (gangs
    without a bound, shared workers, anything not trainwave's) never ends in its count."""

    now: float  # seconds since the epoch
    gangs: tuple[BoundedGang, ...] = ()


@dataclass(frozen=True)
class HeldRoom:
    """A protected gang and the nodes held for it."""

    key: str
    request: GangRequest
    usable: frozenset[str]


Fits = Callable[[ClusterSnapshot, GangRequest], bool]


class ShadowClock:
    """One pass of the queue: the bounded gangs, those the pass admits included, and each
    protected gang's shadow time, found once. Later admissions leave a shadow alone: rule 3
    keeps them off the protected gang's nodes, and rule 9's own end before its shadow."""

    def __init__(self, bounds: RunBounds, margin: float, fits: Fits):
        self.now = bounds.now
        self.margin = margin  # the backfilled gang's release is written after the round
        self.fits = fits
        self.gangs = list(bounds.gangs)
        self._shadows: dict[str, float | None] = {}

    def still_held(
        self, working: ClusterSnapshot, protected: Sequence[HeldRoom], max_run: float
    ) -> frozenset[str]:
        """The held nodes a gang that runs `max_run` seconds from now must leave alone:
        those of every protected gang whose room could be complete before it ends."""
        ends_by = self.now + max_run + self.margin
        still = frozenset[str]()
        for room in protected:
            shadow = self.shadow(working, room)
            if shadow is None or shadow < ends_by:
                still |= room.usable
        return still

    def shadow(self, working: ClusterSnapshot, room: HeldRoom) -> float | None:
        if room.key not in self._shadows:
            self._shadows[room.key] = self._shadow(working, room)
        return self._shadows[room.key]

    def _shadow(self, working: ClusterSnapshot, room: HeldRoom) -> float | None:
        """The earliest second at which the gang fits once the bounded gangs on its nodes
        that end by then are gone; None when it does not even after all of them."""
        mine = sorted(
            (g for g in self.gangs if any(node in room.usable for node, _ in g.workers_by_node)),
            key=lambda g: g.end,
        )
        if not mine:
            return None

        def fits(index: int) -> bool:
            # One derived snapshot per pod shape, not per gang: most gangs share a shape.
            gone: dict[PodNeeds, dict[str, int]] = {}
            for ended in mine[: index + 1]:
                counts = gone.setdefault(ended.needs, {})
                for node, count in ended.workers_by_node:
                    counts[node] = counts.get(node, 0) - count
            at = working
            for needs, counts in gone.items():
                at = at.with_workers(needs, counts)
            return self.fits(at, room.request)

        if not fits(len(mine) - 1):
            return None
        # Fitting only grows as more gangs end: the first prefix that fits, by bisection.
        # Gangs ending at the same second leave together, so the answer is that second.
        first = bisect.bisect_left(range(len(mine)), True, key=fits)
        return max(self.now, mine[first].end)

    def admitted(self, needs: PodNeeds, nodes: Iterable[str], max_run: float) -> None:
        """A whole-GPU gang the pass admits with a bound: it ends in later shadows."""
        counts: dict[str, int] = {}
        for node in nodes:
            counts[node] = counts.get(node, 0) + 1
        end = self.now + max_run + self.margin
        self.gangs.append(BoundedGang(end, needs, tuple(sorted(counts.items()))))
