"""Events are posted in the background, as client-go's event recorder does.

A reconcile hands its Events over and moves on; one task posts them in order.
client-go's broadcaster works the same way (record/event.go: a queue of 1,000
events, dropped with a log line when full, written by its own goroutine), so
a slow Event write never holds a reconcile worker, and an Event is news, not
state: losing one under overload must not lose a decision.

With --namespace (Helm `watchNamespaces`) the operator may post Events only in
those namespaces: the chart grants Events through a Role in each and nowhere
else. An Event the recorder is handed about an object outside them (a job of
another namespace, or a cluster-scoped object such as a Node, whose Events go
to `default`) is dropped with a log line instead of failing at the API server.
"""

from __future__ import annotations

import asyncio
import fnmatch
import logging
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from trainwave.lifecycle.decide import JobEvent

logger = logging.getLogger(__name__)

MAX_QUEUED = 1000  # client-go's maxQueuedEvents
Post = Callable[[dict[str, Any], JobEvent, datetime], None]  # blocking; run in a thread
Queued = tuple[dict[str, Any], JobEvent, datetime]


def watched(namespace: str, namespaces: Sequence[str]) -> bool:
    """Whether `namespace` is one of `namespaces` (names or shell patterns, as
    --namespace takes them); an empty list watches every namespace."""
    return not namespaces or any(fnmatch.fnmatchcase(namespace, p) for p in namespaces)


class EventRecorder:
    def __init__(self, post: Post, *, max_queued: int = MAX_QUEUED, namespaces: Sequence[str] = ()):
        """`namespaces`: where Events may be posted (the operator's --namespace); empty:
        anywhere."""
        self._post = post
        self._queue: asyncio.Queue[Queued] = asyncio.Queue(max_queued)
        self._task: asyncio.Task[None] | None = None
        self._namespaces = tuple(namespaces)
        self.dropped = 0
        self.outside = 0  # Events dropped because their namespace is not watched

    def record(self, job: dict[str, Any], event: JobEvent) -> None:
        """Queue `event` about `job`; its time is now, not when it is posted."""
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
