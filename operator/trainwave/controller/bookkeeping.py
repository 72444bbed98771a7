"""What the reconciler remembers of each job between reconciles, and why.

Every map here is an expectation or a memory the API cannot hold for us, each
dropped as soon as the watch catches up or the job goes:
- the body our last status write returned, while the watch still shows the version
  that write replaced (a decision never rests on a status older than our own;
  resourceVersions are compared by equality, never by order, as the API asks);
- pods created and not seen by the watch yet (kube/expectations.py, tagged by attempt);
- EndpointSlices applied and not seen yet (the same `Expectations`: otherwise each
  reconcile between the apply and its watch event applied the slice once more);
- the UID of the Service applied with the job's latest pods, which the slice that
  names them takes as owner (used once: a Service deleted since costs one slice
  that garbage collection removes, and the next publish applies the Service again);
- a status held after a gang was created placed (lifecycle/plan.py says when);
- children refused in a row (the backoff's count) and what the goodput decisions
  remember of the reports between polls.
"""

import time
from collections.abc import Callable
from typing import Any

from trainwave.api.status import TrainingJobStatus
from trainwave.api.trainingjob import JobKey
from trainwave.kube.expectations import Expectations
from trainwave.lifecycle.endpoints import ServiceState
from trainwave.lifecycle.goodput import Memory
from trainwave.lifecycle.observed import WorkerPod
from trainwave.lifecycle.plan import Held

# Pods created but not yet seen by the watch hold the job's next decision back at most
# this long (kube-controller-manager's ControllerExpectations wait 5 minutes); so do
# Services applied and not seen.
EXPECTATIONS_SECONDS = 15.0
# The one name a job's Service expectation awaits: a job has one headless Service.
_SERVICE = "service"


def _monotonic() -> float:
    # Looked up on each call, not bound once: tests move time.monotonic to expire these.
    return time.monotonic()


class Bookkeeping:
    def __init__(self, clock: Callable[[], float] = _monotonic) -> None:
        # Per job: (the resourceVersion our last status write replaced, the body it returned).
        self._written: dict[JobKey, tuple[str, dict[str, Any]]] = {}
        self._pods: Expectations[JobKey] = Expectations(EXPECTATIONS_SECONDS, clock)
        self._services: Expectations[JobKey] = Expectations(EXPECTATIONS_SECONDS, clock)
        self._service_applied: dict[JobKey, ServiceState] = {}  # what it last applied
        self._foreign_slices: set[JobKey] = set()  # jobs with another controller's slice
        self._service_uids: dict[JobKey, str] = {}  # applied with the pods, not used yet
        self._held: dict[JobKey, Held] = {}
        self._refusals: dict[JobKey, int] = {}
        self._memories: dict[JobKey, Memory] = {}

    def forget(self, key: JobKey) -> None:
        """The job is gone or going: drop everything kept about it."""
        self._written.pop(key, None)
        self._pods.delete(key)
        self._services.delete(key)
        self._service_applied.pop(key, None)
        self._foreign_slices.discard(key)
        self._service_uids.pop(key, None)
        self._held.pop(key, None)
        self._refusals.pop(key, None)
        self._memories.pop(key, None)

    # -- the last status write ------------------------------------------------------------

    def wrote(self, key: JobKey, replaced: str, returned: dict[str, Any]) -> None:
        self._written[key] = (replaced, returned)

    def fresher(self, key: JobKey, body: dict[str, Any] | None) -> dict[str, Any] | None:
        """The watched body, or the one our last status write returned if the watch has not
        caught up with that write yet."""
        written = self._written.get(key)
        if body is None or written is None:
            self._written.pop(key, None)
            return body
        replaced, returned = written
        if body["metadata"].get("resourceVersion") == replaced:
            return returned
        self._written.pop(key, None)  # the watch has moved past it
        return body

    # -- pods and Services created, not seen yet --------------------------------------------

    def expect_pods(self, key: JobKey, attempt: int, names: frozenset[str]) -> None:
        self._pods.expect(key, names, tag=attempt)

    def unseen(self, key: JobKey, pods: list[WorkerPod]) -> float | None:
        """Seconds to wait while pods this reconciler created are not in the watch cache yet;
        None to decide now. Deciding before the watch shows them would apply them again
        and write a status that counts them missing; their ADDED events wake the job.
        Only pods of the attempt they were created for count as seen."""
        expected = self._pods.get(key)
        if expected is None:
            return None
        return self._pods.wait(key, {p.name for p in pods if p.attempt == expected.tag})

    def applied_service(self, key: JobKey, state: ServiceState) -> None:
        self._services.expect(key, {_SERVICE})
        self._service_applied[key] = state

    def applied_service_with_pods(self, key: JobKey, uid: str) -> None:
        self._service_uids[key] = uid

    def service_uid(self, key: JobKey) -> str | None:
        """The UID of the Service applied with the job's latest pods, once; None: the
        publishing reconcile applies the Service itself."""
        return self._service_uids.pop(key, None)

    def foreign_slices(self, key: JobKey, seen: bool | None = None) -> bool:
        """Whether the watch last showed another controller's EndpointSlice for the job's
        Service (kube-controller-manager's, from when it had a selector); `seen` updates it."""
        if seen is True:
            self._foreign_slices.add(key)
        elif seen is False:
            self._foreign_slices.discard(key)
        return key in self._foreign_slices

    def service_exists(self, key: JobKey, state: ServiceState, watched: bool) -> bool:
        """The watch shows the job's EndpointSlice naming `state` (`watched`: its attempt
        and addresses), or this reconciler applied exactly that less than
        EXPECTATIONS_SECONDS ago. A slice deleted or changed later is applied again."""
        if watched:
            self._services.wait(key, {_SERVICE})  # met: forgotten
            return True
        awaited = self._services.wait(key, ())
        return awaited is not None and self._service_applied.get(key) == state

    def service_in_flight(self, key: JobKey) -> ServiceState | None:
        """What this reconciler last applied to the job's EndpointSlice, while the watch has
        not shown it and less than EXPECTATIONS_SECONDS have passed."""
        if self._services.wait(key, ()) is None:
            return None
        return self._service_applied.get(key)

    # -- a held status ------------------------------------------------------------------------

    def hold(self, key: JobKey, held: Held) -> None:
        self._held[key] = held

    def held(self, key: JobKey, uid: str, written: TrainingJobStatus) -> Held | None:
        """The status held for the job, while it still stands in for the written one."""
        held = self._held.get(key)
        if held is None:
            return None
        if not held.stands_for(uid, written):
            del self._held[key]
            return None
        return held

    def drop_held(self, key: JobKey) -> None:
        self._held.pop(key, None)

    # -- refusals in a row, goodput memory -----------------------------------------------------

    def refused(self, key: JobKey) -> int:
        """One more child refused in a row: how many now."""
        count = self._refusals[key] = self._refusals.get(key, 0) + 1
        return count

    def created(self, key: JobKey) -> None:
        """Everything the job asked for went through: its refusals in a row end."""
        self._refusals.pop(key, None)

    def memory(self, key: JobKey) -> Memory | None:
        return self._memories.get(key)

    def remember(self, key: JobKey, memory: Memory | None) -> None:
        # Kept whether or not the status is written: what it counts is only ever what is
        # new in the reports, so deciding again from it counts nothing twice.
        if memory is None:
            self._memories.pop(key, None)
        else:
            self._memories[key] = memory
