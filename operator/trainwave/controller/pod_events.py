"""The Events of workers sitting Pending on their nodes, listed on demand.

What a worker sitting so looks like and which Event explains it: lifecycle/sitting.py.
Here: when to ask. Each reconcile tells which of its workers sit (`observe`) and gets back
what was last read for them; a loop of its own (`run`, beside the status poller) lists a
worker's Events once it has sat LOOKUP_AFTER seconds (most starts take less), then every
LOOKUP_EVERY seconds while it still sits, and wakes the job only when what they say
changed. A worker that starts is dropped by the reconcile its pod's change brings, so a
gang that starts normally costs no lookup and no extra reconcile. Events are listed, never
watched: a watch of every pod Event in the cluster would cost every operator all the time,
for what is rare. One LIST by the pod's UID each time, lowest rank first, at most
LOOKUPS_PER_JOB per job and LOOKUPS_PER_SECOND in all, so a slow start on many nodes of a
large cluster cannot turn into a burst of LISTs.
"""

import asyncio
import logging
import time
from collections.abc import Callable
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
LOOKUPS_PER_JOB = 2  # each time the loop looks; the job names one worker
LOOKUPS_PER_SECOND = 5
TICK_SECONDS = 1.0

# (namespace, pod UID) -> that pod's Events, as the API lists them.
Lookup = Callable[[str, str], list[dict[str, Any]]]


@dataclass
class _Sitting:
    rank: int
    name: str
    since: float  # monotonic: first seen sitting
    checked: float | None = None
    said: str = ""
    failed: bool = False  # a lookup failed: logged once

    def due_at(self) -> float:
        if self.checked is None:
            return self.since + LOOKUP_AFTER
        return self.checked + LOOKUP_EVERY


class PodEvents:
    def __init__(
        self,
        lookup: Lookup,
        wake: Callable[[JobKey], None] = lambda key: None,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
    ):
        self._lookup = lookup
        self._wake = wake
        self._clock = clock
        self._wall = wall
        self._sitting: dict[JobKey, dict[str, _Sitting]] = {}  # by pod UID

    def observe(self, key: JobKey, pods: list[WorkerPod], attempt: int) -> list[WorkerPod]:
        """Track the workers of `pods` that sit (and only those); `pods` with what each
        one's newest Event said when last read."""
        now = self._clock()
        known = self._sitting.get(key, {})
        kept = {
            p.uid: known.get(p.uid) or _Sitting(p.rank, p.name, since=now)
            for p in pods
            if sits_pending(p, attempt)
        }
        if not kept:
            self._sitting.pop(key, None)
            return pods
        self._sitting[key] = kept
        return [replace(p, event_says=kept[p.uid].said) if _said(kept, p) else p for p in pods]

    def forget(self, key: JobKey) -> None:
        self._sitting.pop(key, None)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(TICK_SECONDS)
            await self.look_up_due()

    async def look_up_due(self) -> None:
        """Look up the workers due, within the rate; wake each job whose words changed."""
        now = self._clock()
        budget = max(1, int(LOOKUPS_PER_SECOND * TICK_SECONDS))
        for key, sitting in list(self._sitting.items()):
            due = sorted((s for s in sitting.items() if now >= s[1].due_at()), key=_rank)
            changed = False
            for uid, worker in due[:LOOKUPS_PER_JOB]:
                if budget == 0:
                    break
                budget -= 1
                changed |= await self._look_up(key, uid, worker, now)
            if changed:
                self._wake(key)
            if budget == 0:
                return

    async def _look_up(self, key: JobKey, uid: str, worker: _Sitting, now: float) -> bool:
        """Whether what the worker's Events say changed."""
        worker.checked = now
        try:
            events = await asyncio.to_thread(self._lookup, key[0], uid)
        except (ApiException, HTTPError, OSError) as error:
            # Only the job's message is poorer for it; said once per worker (a chart
            # without `list` on events, an API server that is busy).
            if not worker.failed:
                reason = getattr(error, "reason", None) or error
                logger.info("%s/%s: could not list the events of %s: %s", *key, worker.name, reason)
            worker.failed = True
            return False
        said = explaining_event(events, self._wall())
        changed = said != worker.said
        worker.said = said
        return changed


def _rank(item: tuple[str, _Sitting]) -> int:
    return item[1].rank


def _said(kept: dict[str, _Sitting], pod: WorkerPod) -> bool:
    found = kept.get(pod.uid)
    return found is not None and bool(found.said)
