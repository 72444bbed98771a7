"""Events are posted in the background, as client-go's event recorder does.

A reconcile hands its Events over and moves on; one task posts them in order.
client-go's broadcaster works the same way (k8s.io/client-go tools/record/event.go:
a queue of 1,000 events, dropped with a log line when full, written by its own
goroutine), so a slow Event write never holds a reconcile worker, and an Event is
news, not state: losing one under overload must not lose a decision. Reasons that
flap may be held to a rate per object (tools/record/events_cache.go's
EventSourceObjectSpamFilter, a token bucket per object); which reasons, the
controller says (`rates`).

With --namespace (Helm `watchNamespaces`) the operator may post Events only in
those namespaces: the chart grants Events through a Role in each and nowhere
else. An Event the recorder is handed about an object outside them (a job of
another namespace, or a cluster-scoped object such as a Node, whose Events go
to `default`) is dropped with a log line instead of failing at the API server.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Generic, Protocol, TypeVar

from trainwave.kube.namespaced import watched

logger = logging.getLogger(__name__)

MAX_QUEUED = 1000  # client-go's maxQueuedEvents


@dataclass(frozen=True)
class Rate:
    """A token bucket per object and reason: `burst` Events at once, then one per
    `every` seconds (client-go's EventSourceObjectSpamFilter does the same per object,
    25 at once then one per 5 minutes)."""

    burst: int
    every: float


class Event(Protocol):
    """What the recorder needs of an Event: its reason, for the rate and the logs."""

    @property
    def reason(self) -> str: ...


E = TypeVar("E", bound=Event)
MAX_BUCKETS = 4096  # beyond this, buckets full again are swept (objects long gone)
Post = Callable[[dict[str, Any], E, datetime], None]  # blocking; run in a thread


class EventRecorder(Generic[E]):
    def __init__(
        self,
        post: Post[E],
        *,
        max_queued: int = MAX_QUEUED,
        namespaces: Sequence[str] = (),
        rates: Mapping[str, Rate] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        """`post(obj, event, when)` writes one Event about `obj` (a body with metadata).
        `namespaces`: where Events may be posted (the operator's --namespace); empty:
        anywhere. `rates`: reasons held to a rate per object; none by default."""
        self._post = post
        self._queue: asyncio.Queue[tuple[dict[str, Any], E, datetime]] = asyncio.Queue(max_queued)
        self._task: asyncio.Task[None] | None = None
        self._namespaces = tuple(namespaces)
        self._rates = dict(rates or {})
        self._clock = clock
        # (namespace, name, reason) -> (tokens left, when they were counted)
        self._buckets: dict[tuple[str, str, str], tuple[float, float]] = {}
        self.dropped = 0
        self.outside = 0  # Events dropped because their namespace is not watched
        self.limited = 0  # Events dropped by their reason's rate

    def record(self, job: dict[str, Any], event: E) -> None:
        """Queue `event` about `job` (any object); its time is now, not when it is posted."""
        namespace = str(job["metadata"].get("namespace") or "")
        if self._namespaces and not watched(namespace, self._namespaces):
            self.outside += 1
            logger.warning(
                "not posting Event %s about %s: namespace %r is outside the watched "
                "namespaces %s, where the operator may not write Events",
                event.reason,
                job["metadata"].get("name"),
                namespace or "(cluster-scoped)",
                ", ".join(self._namespaces),
            )
            return
        name = str(job["metadata"].get("name"))
        if not self._allowed(namespace, name, event.reason):
            self.limited += 1
            logger.info(
                "Event %s about %s/%s held back: more than its rate allows",
                event.reason,
                namespace,
                name,
            )
            return
        try:
            self._queue.put_nowait((job, event, datetime.now(UTC)))
        except asyncio.QueueFull:
            self.dropped += 1
            logger.warning(
                "event queue full (%d): dropped %s for %s",
                self._queue.maxsize,
                event.reason,
                job["metadata"]["name"],
            )

    def _allowed(self, namespace: str, name: str, reason: str) -> bool:
        rate = self._rates.get(reason)
        if rate is None:
            return True
        key = (namespace, name, reason)
        now = self._clock()
        tokens, then = self._buckets.get(key, (float(rate.burst), now))
        tokens = min(float(rate.burst), tokens + (now - then) / rate.every)
        allowed = tokens >= 1.0
        self._buckets[key] = (tokens - 1.0 if allowed else tokens, now)
        if len(self._buckets) > MAX_BUCKETS:
            self._sweep(now)
        return allowed

    def _sweep(self, now: float) -> None:
        """Drop the buckets full again: a full one is what a missing one means."""
        for key, (tokens, then) in list(self._buckets.items()):
            rate = self._rates[key[2]]
            if tokens + (now - then) / rate.every >= rate.burst:
                del self._buckets[key]

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="event-recorder")

    async def drain(self) -> None:
        """Wait until every queued Event has been posted (tests, shutdown)."""
        await self._queue.join()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        while True:
            job, event, when = await self._queue.get()
            try:
                await asyncio.to_thread(self._post, job, event, when)
            except Exception:  # never let one bad Event stop the others
                logger.exception("posting event %s failed", event.reason)
            finally:
                self._queue.task_done()
