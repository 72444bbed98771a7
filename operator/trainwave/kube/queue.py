"""A coalescing work queue of keys, the heart of level-triggered reconciling.

Mirrors client-go's workqueue (k8s.io/client-go util/workqueue) on asyncio:

- queue.go: many events about one object (its pods change, its spec changes)
  collapse into one pending run of its key. A key is never processed by two
  workers at once (the `processing` set); a key added while it is processed is
  marked `dirty` and runs again right after, so no event is lost.
- delaying_queue.go: `add(key, after=...)` waits first; of several delayed adds
  the earliest time wins, and one for a key already waiting to run now is dropped.
- rate_limiting_queue.go and default_rate_limiters.go: a failed run is retried
  after its key's `ItemBackoff.when(key)`, the exponential per-item delay of
  ItemExponentialFailureRateLimiter, lengthened at random (see ItemBackoff);
  a run that succeeds `forget`s the key's failures.

The worker returns the seconds after which to run again (controller-runtime's
Result.RequeueAfter), or None.
"""

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Hashable

from trainwave.backoff import Backoff

logger = logging.getLogger(__name__)

Key = Hashable
# A failed reconcile is retried after 1, 2, 4 ... 60 s (failures of that key in a row),
# each up to a tenth longer at random.
RETRY = Backoff(base=1.0, cap=60.0, jitter=0.1)
Worker = Callable[[Key], Awaitable[float | None]]


class ItemBackoff:
    """Per key, the delay before its n-th retry in a row: `backoff.delay(n)`.

    client-go's ItemExponentialFailureRateLimiter (When, Forget, NumRequeues) is
    `base * 2**(n-1)` up to a cap and has no jitter; here `backoff.jitter` adds up to
    that fraction at random (wait.Backoff's Jitter), so keys that failed together (an
    API server restart fails every reconcile at once) are not retried together.
    """

    def __init__(self, backoff: Backoff = RETRY, rand: Callable[[], float] = random.random):
        self._backoff = backoff
        self._rand = rand
        self._failures: dict[Key, int] = {}

    def when(self, key: Key) -> float:
        """Count one more failure of `key`; the seconds to wait before its retry."""
        failures = self._failures.get(key, 0) + 1
        self._failures[key] = failures
        return self._backoff.delay(failures, self._rand)

    def forget(self, key: Key) -> None:
        """`key` succeeded: its next failure waits the shortest delay again."""
        self._failures.pop(key, None)

    def requeues(self, key: Key) -> int:
        """Failures of `key` in a row (client-go's NumRequeues)."""
        return self._failures.get(key, 0)

    def __len__(self) -> int:
        return len(self._failures)


class WorkQueue:
    def __init__(self, work: Worker, *, retry: Backoff = RETRY, limiter: ItemBackoff | None = None):
        """`retry`: the backoff of failed runs, unless a `limiter` is given."""
        self._work = work
        self._ready: asyncio.Queue[Key] = asyncio.Queue()
        self._queued: set[Key] = set()
        self._busy: set[Key] = set()
        self._dirty: set[Key] = set()
        self._timers: dict[Key, tuple[float, asyncio.TimerHandle]] = {}
        self.limiter = limiter if limiter is not None else ItemBackoff(retry)
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

    def add_rate_limited(self, key: Key) -> float:
        """Add `key` after its limiter's delay (client-go's AddRateLimited); that delay."""
        delay = self.limiter.when(key)
        self.add(key, after=delay)
        return delay

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
                delay = self.limiter.when(key)
                logger.exception(
                    "reconcile of %s failed (%d in a row); retrying in %.1fs",
                    key,
                    self.limiter.requeues(key),
                    delay,
                )
                requeue = delay
            else:
                self.limiter.forget(key)
            finally:
                self._busy.discard(key)
            if key in self._dirty:
                self._dirty.discard(key)
                self.add(key)
            if requeue is not None:
                self.add(key, after=requeue)
