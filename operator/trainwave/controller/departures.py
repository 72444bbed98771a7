"""Worker pods seen leaving unfinished, kept until their attempt is over.

The job cache drops a pod on its DELETED event, and with it the evidence of why
it went: an evicted or preempted pod carries DisruptionTarget only in its last
state, and when it is deleted at once (grace 0, as on kwok, or a force delete)
the reconcile that event wakes often sees the pod already gone. The last state
is kept here, so the failure policy judges the pod by what happened to it
instead of as a worker that vanished for no known reason.

The job cache's informer thread records here *before* it drops the pod from the
store, and a reconcile reads the store first and this second, so a reconcile on
the event loop never finds a departed pod in neither. Recording by way of the
loop (call_soon_threadsafe) left a window: a reconcile already running, woken by
the pod's eviction, read the store just after the drop and the departures just
before the queued record ran, and judged the pod vanished (found by the chaos
suite: an evicted worker counted as a failure). Hence the lock: two threads.

A worker deleted while the watch was down reaches here from the relist that
notices it gone (informer.py's DeletedFinalStateUnknown), with the last state the
operator saw rather than its final one: it is judged "deleted before it
finished" (or by an exit code or DisruptionTarget seen before the gap) instead of
"vanished".

In memory only: after an operator restart a pod that left meanwhile is judged
as vanished (a counted restart), the same as before this existed.
"""

import threading
from dataclasses import replace

from trainwave.api.trainingjob import JobKey
from trainwave.lifecycle.observed import PodPhase, WorkerPod


class Departures:
    def __init__(self) -> None:
        self._left: dict[JobKey, dict[str, WorkerPod]] = {}
        self._lock = threading.Lock()

    def record(self, key: JobKey, pod: WorkerPod) -> None:
        """A pod's last state on its DELETED event. A pod that succeeded is no news; a
        failed one is kept too: its exit code, reason or DisruptionTarget is the evidence
        the failure policy judges, and the pod may be gone before a reconcile reads it."""
        if pod.phase == PodPhase.SUCCEEDED:
            return
        with self._lock:
            self._left.setdefault(key, {})[pod.name] = replace(pod, deleting=True, departed=True)

    def of(self, key: JobKey, attempt: int) -> list[WorkerPod]:
        with self._lock:
            return [p for p in self._left.get(key, {}).values() if p.attempt == attempt]

    def keep_only(self, key: JobKey, attempt: int) -> None:
        """Forget pods of attempts before `attempt`: the decision has moved past them."""
        with self._lock:
            pods = self._left.get(key)
            if not pods:
                return
            kept = {name: p for name, p in pods.items() if p.attempt >= attempt}
            if kept:
                self._left[key] = kept
            else:
                del self._left[key]

    def forget(self, key: JobKey) -> None:
        with self._lock:
            self._left.pop(key, None)

    def __len__(self) -> int:
        with self._lock:
            return sum(len(pods) for pods in self._left.values())
