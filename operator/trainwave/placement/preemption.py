"""Priority preemption of whole gangs: which running gangs to evict for a waiting one. Pure.

Algorithm overview
------------------
After the queue (queueing.py) has admitted what fits, each gang still waiting, in
queue order, may preempt. Its victims can only be whole running gangs of lower
priority that are preemptible (`placement.preemptible`, and not a PriorityClass with
`preemptionPolicy: Never`), and not preempted within the grace period before `now`.

For each domain of the pipeline level (a rack), and then for the whole cluster:
  1. take the candidate gangs that hold anything in that domain, lowest priority
     first, then smallest;
  2. remove them one at a time from the snapshot until the waiting gang fits;
  3. prune: drop every victim (latest first) the gang still fits without.
The option with the fewest victims wins, then the fewest GPUs taken back, then the
lowest total priority, then the domain order: a small, local eviction is preferred
to a scattered one, as the topology objective wants. The chosen victims' room is
then spoken for: later waiting gangs in the same round plan against a snapshot
without the victims and with the preemptor placed.

Invariants: never part of a gang; never a gang of equal or higher priority; never
a non-preemptible gang; a gang is a victim at most once per grace period; a
preemption is planned only when the preemptor then fits (checked by place()).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from trainwave.placement.gang import place
from trainwave.placement.gang_types import GangRequest, Placement
from trainwave.placement.queueing import Wait
from trainwave.placement.requirements import PodNeeds
from trainwave.placement.snapshot import ClusterSnapshot

DEFAULT_GRACE = timedelta(minutes=5)


@dataclass(frozen=True)
class RunningGang:
    """A gang that holds resources now (bound or released pods of its current attempt)."""

    key: str  # namespace/name
    priority: int
    preemptible: bool
    needs: PodNeeds  # one worker's pod
    workers_by_node: tuple[tuple[str, int], ...]
    preempted_at: datetime | None = None  # when an earlier attempt was preempted
    run_until: float | None = None  # runPolicy.maxRunSeconds stops it then (epoch seconds)

    @property
    def gpus(self) -> int:
        per_worker = dict(self.needs.requests).get("nvidia.com/gpu", 0)
        return per_worker * sum(count for _, count in self.workers_by_node)


@dataclass(frozen=True)
class Preemption:
    preemptor: str  # namespace/name of the waiting gang
    victims: tuple[str, ...]  # namespace/name of each gang to evict
    placement: Placement  # where the preemptor fits once they are gone
    message: str


def plan_preemptions(
    snapshot: ClusterSnapshot,
    waiting: Sequence[Wait],
    running: Sequence[RunningGang],
    now: datetime,
    grace: timedelta = DEFAULT_GRACE,
) -> tuple[Preemption, ...]:
    working = snapshot
    taken: set[str] = set()
    plans: list[Preemption] = []
    for wait in waiting:
        request = wait.job.request
        if request.shared_mib is not None:
            continue  # shared gangs ask for GPU memory, which whole gangs never use
        candidates = [
            gang
            for gang in running
            if gang.key not in taken
            and gang.key != wait.job.key
            and gang.preemptible
            and gang.priority < wait.job.priority
            and (gang.preempted_at is None or now - gang.preempted_at >= grace)
        ]
        if not candidates:
            continue
        found = _cheapest(working, request, candidates)
        if found is None:
            continue
        victims, placement = found
        for gang in victims:
            working = _without(working, gang)
            taken.add(gang.key)
        working = working.with_workers(request.needs, placement.workers_by_node())
        names = ", ".join(g.key for g in victims)
        message = (
            f"preempted by {wait.job.key} (priority {wait.job.priority}) to make room for "
            f"{placement.describe()}; evicting {names}"
        )
        plans.append(Preemption(wait.job.key, tuple(g.key for g in victims), placement, message))
    return tuple(plans)


def _cheapest(
    snapshot: ClusterSnapshot, request: GangRequest, candidates: list[RunningGang]
) -> tuple[list[RunningGang], Placement] | None:
    topology = snapshot.topology
    level = topology.pipeline_level
    scopes: list[set[str] | None] = []
    if level > 0:
        for domain in topology.domains[level]:
            scopes.append(set(topology.node_names[domain.first : domain.stop]))
    scopes.append(None)  # the whole cluster
    best: tuple[tuple[int, int, int, int], list[RunningGang], Placement] | None = None
    for order, scope in enumerate(scopes):
        local = [
            g for g in candidates if scope is None or any(n in scope for n, _ in g.workers_by_node)
        ]
        local.sort(key=lambda g: (g.priority, g.gpus, g.key))
        found = _evict_until_fits(snapshot, request, local)
        if found is None:
            continue
        victims, placement = found
        rank = (
            len(victims),
            sum(g.gpus for g in victims),
            sum(g.priority for g in victims),
            order,
        )
        if best is None or rank < best[0]:
            best = (rank, victims, placement)
    return None if best is None else (best[1], best[2])


def _evict_until_fits(
    snapshot: ClusterSnapshot, request: GangRequest, ordered: list[RunningGang]
) -> tuple[list[RunningGang], Placement] | None:
    chosen: list[RunningGang] = []
    working = snapshot
    for gang in ordered:
        chosen.append(gang)
        working = _without(working, gang)
        if isinstance(place(working, request), Placement):
            break
    else:
        return None
    for gang in reversed(list(chosen)):  # prune what was not needed after all
        rest = [g for g in chosen if g is not gang]
        trial = snapshot
        for other in rest:
            trial = _without(trial, other)
        if isinstance(place(trial, request), Placement):
            chosen = rest
    final = snapshot
    for gang in chosen:
        final = _without(final, gang)
    placement = place(final, request)
    assert isinstance(placement, Placement)
    return chosen, placement


def _without(snapshot: ClusterSnapshot, gang: RunningGang) -> ClusterSnapshot:
    index = snapshot.topology.node_index
    counts = {node: -count for node, count in gang.workers_by_node if node in index}
    return snapshot.with_workers(gang.needs, counts)
