"""A coalescing work queue of job keys, the heart of level-triggered reconciling.

Many events about one job (its pods change, its spec changes) collapse into
one pending reconcile of that job. A key is never processed by two workers at
once; a key added while it is being processed runs again right after, so no
event is lost. Delayed adds (deadlines, TTLs, retries, batched pod events) keep
the earliest time, and are dropped for a key already waiting to run now.
"""

import asyncio
import logging
from collections.abc import Awaitable, Callable, Hashable

from trainwave.backoff import Backoff

logger = logging.getLogger(__name__)

Key = Hashable
# A failed reconcile is retried after 1, 2, 4 ... 60 s (failures of that key in a row,
# workqueue's ItemExponentialFailureRateLimiter), each up to a tenth longer at random.
RETRY = Backoff(base=1.0, cap=60.0, jitter=0.1)
Worker = Callable[[Key], Awaitable[float | None]]


class WorkQueue:
    def __init__(self, work: Worker, *, retry: Backoff = RETRY):
        self._work = work
        self._ready: asyncio.Queue[Key] = asyncio.Queue()
        self._queued: set[Key] = set()
        self._busy: set[Key] = set()
        self._dirty: set[Key] = set()
        self._timers: dict[Key, tuple[float, asyncio.TimerHandle]] = {}
        self._failures: dict[Key, int] = {}
        self._retry = retry
        self._tasks: list[asyncio.Task[None]] = []

    def add(self, key: Key, after: float = 0.0) -> None:
        if after > 0:
            self._add_later(key, after)
            return
        if key in self._busy:
            self._dirty.add(key)
        elif key not in self._queued:
            self._queued.add(key)
            self._ready.put_nowait(key)

    def _add_later(self, key: Key, after: float) -> None:
        if key in self._queued:
            return  # it runs soon and reads everything there is to read then
        loop = asyncio.get_running_loop()
        due = loop.time() + after
        existing = self._timers.get(key)
        if existing and existing[0] <= due:
            return
        if existing:
            existing[1].cancel()
        self._timers[key] = (due, loop.call_at(due, self._fire, key))

    def _fire(self, key: Key) -> None:
        self._timers.pop(key, None)
        self.add(key)

    @property
    def depth(self) -> int:
        return len(self._queued)

    def start(self, workers: int) -> None:
        self._tasks = [
            asyncio.create_task(self._run(), name=f"reconciler-{i}") for i in range(workers)
        ]

    async def stop(self) -> None:
        for _, timer in self._timers.values():
            timer.cancel()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            key = await self._ready.get()
            self._queued.discard(key)
            self._busy.add(key)
            try:
                requeue = await self._work(key)
            except asyncio.CancelledError:
                raise
            except Exception:
                failures = self._failures.get(key, 0) + 1
                self._failures[key] = failures
                delay = self._retry.delay(failures)
                logger.exception(
                    "reconcile of %s failed (%d in a row); retrying in %.1fs", key, failures, delay
                )
                requeue = delay
            else:
                self._failures.pop(key, None)
            finally:
                self._busy.discard(key)
            if key in self._dirty:
                self._dirty.discard(key)
                self.add(key)
            if requeue is not None:
                self.add(key, after=requeue)
