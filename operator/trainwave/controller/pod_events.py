"""The Events of workers sitting Pending on their nodes, listed on demand.

What a worker sitting so looks like and which Event explains it: lifecycle/sitting.py.
Here: when to ask. Events are listed, never watched: a watch of every pod Event in the
cluster would cost every operator all the time, for what is rare. A worker is looked up
once it has sat LOOKUP_AFTER seconds (most starts take less), then every LOOKUP_EVERY
seconds while it still sits: one LIST by the pod's UID each time, lowest rank first, at
most LOOKUPS_PER_RECONCILE a reconcile (the job names one worker), and no more than
LOOKUPS_PER_SECOND across all jobs, so a slow start on many nodes of a large cluster
cannot turn into a burst of LISTs.
"""

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from trainwave.api.trainingjob import JobKey
from trainwave.lifecycle.observed import WorkerPod
from trainwave.lifecycle.sitting import explaining_event, sits_pending

logger = logging.getLogger(__name__)

LOOKUP_AFTER = 10.0
LOOKUP_EVERY = 30.0
LOOKUPS_PER_RECONCILE = 2
LOOKUPS_PER_SECOND = 5.0
# A reconcile asked back for a lookup that the rate deferred comes no sooner than this.
DEFERRED_SECONDS = 1.0

# (namespace, pod UID) -> that pod's Events, as the API lists them.
Lookup = Callable[[str, str], list[dict[str, Any]]]


@dataclass
class _Sitting:
    since: float  # monotonic: first seen sitting
    checked: float | None = None
    said: str = ""
    failed: bool = False  # a lookup failed: logged once


class PodEvents:
    def __init__(
        self,
        lookup: Lookup,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
    ):
        self._lookup = lookup
        self._clock = clock
        self._wall = wall
        self._sitting: dict[JobKey, dict[str, _Sitting]] = {}  # by pod UID
        self._next_slot = 0.0  # monotonic: when the rate allows the next lookup

    async def observe(
        self, key: JobKey, pods: list[WorkerPod], attempt: int
    ) -> tuple[list[WorkerPod], float | None]:
        """`pods` with what each sitting worker's newest Event says, looking up those due;
        and the seconds until the next lookup is due (None: no worker sits)."""
        sitting = sorted((p for p in pods if sits_pending(p, attempt)), key=lambda p: p.rank)
        now = self._clock()
        known = self._sitting.get(key, {})
        kept = {p.uid: known.get(p.uid) or _Sitting(since=now) for p in sitting}
        if not kept:
            self._sitting.pop(key, None)
            return pods, None
        self._sitting[key] = kept
        due = [p for p in sitting if self._due(kept[p.uid], now)]
        for pod in due[:LOOKUPS_PER_RECONCILE]:
            if not self._take_slot(now):
                break
            await self._look_up(key, pod, kept[pod.uid], now)
        said = [replace(p, event_says=kept[p.uid].said) if _said(kept, p) else p for p in pods]
        return said, self._next_due(kept.values(), now)

    def forget(self, key: JobKey) -> None:
        self._sitting.pop(key, None)

    async def _look_up(self, key: JobKey, pod: WorkerPod, sitting: _Sitting, now: float) -> None:
        sitting.checked = now
        try:
            events = await asyncio.to_thread(self._lookup, key[0], pod.uid)
        except (ApiException, HTTPError, OSError) as error:
            # Only the job's message is poorer for it; said once per worker (a chart
            # without `list` on events, an API server that is busy).
            if not sitting.failed:
                reason = getattr(error, "reason", None) or error
                logger.info("%s/%s: could not list the events of %s: %s", *key, pod.name, reason)
            sitting.failed = True
            return
        sitting.said = explaining_event(events, self._wall())

    def _due(self, sitting: _Sitting, now: float) -> bool:
        return now >= self._due_at(sitting)

    @staticmethod
    def _due_at(sitting: _Sitting) -> float:
        if sitting.checked is None:
            return sitting.since + LOOKUP_AFTER
        return sitting.checked + LOOKUP_EVERY

    def _take_slot(self, now: float) -> bool:
        if now < self._next_slot:
            return False
        self._next_slot = max(self._next_slot, now - 1.0) + 1.0 / LOOKUPS_PER_SECOND
        return True

    def _next_due(self, sitting: Iterable[_Sitting], now: float) -> float:
        soonest = min(self._due_at(s) for s in sitting) - now
        return max(soonest, DEFERRED_SECONDS)


def _said(kept: dict[str, _Sitting], pod: WorkerPod) -> bool:
    found = kept.get(pod.uid)
    return found is not None and bool(found.said)
