"""A decision under construction: the status being drafted and the actions that go with it.

Pure. `decide.py` and `placing.py` write into one `Draft`; `finish()` freezes it
into the `Decision` the controller carries out.
"""

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from trainwave.api.status import ConditionType, Phase, TrainingJobStatus
from trainwave.api.trainingjob import ObjectMeta
from trainwave.lifecycle.conditions import clear_condition, set_condition
from trainwave.lifecycle.endpoints import Published
from trainwave.lifecycle.goodput import Memory
from trainwave.lifecycle.observed import WorkerPod
from trainwave.lifecycle.workload_actions import WorkloadAction

_EVENT_TYPES: dict[Phase, Literal["Normal", "Warning"]] = {
    Phase.RESTARTING: "Warning",
    Phase.FAILED: "Warning",
}


@dataclass(frozen=True)
class JobEvent:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str
    # News about the spec rather than a phase: still news whatever phase is written next.
    # A phase's news held with an unwritten status is dropped once a later phase is
    # written instead (controller/reconciler.py _with_held_news); this kind is not.
    lasting: bool = False


@dataclass(frozen=True)
class PlacementWait:
    """The placer's latest word on a gang it could not place: a Blocker code and why."""

    code: str
    reason: str


@dataclass(frozen=True)
class Decision:
    status: TrainingJobStatus
    create_ranks: tuple[int, ...] = ()
    delete_pods: tuple[str, ...] = ()
    # Deleted with grace 0: a replaced worker's pod on a lost or NotReady node, whose
    # kubelet will never confirm a graceful delete, so that its name comes free.
    force_delete_pods: tuple[str, ...] = ()
    events: tuple[JobEvent, ...] = ()
    requeue_after: float | None = None
    delete_job: bool = False
    # Seconds from the start of this attempt's gang to every worker running, set only
    # on the decision that first saw it (the metric is observed once).
    all_running_after: float | None = None
    # Every worker of the attempt exists behind the gate: hand the gang to the placer.
    wants_placement: bool = False
    # What to do to the job's Kueue Workload (lifecycle/admission.py).
    workload: WorkloadAction = WorkloadAction.NONE
    # Write the headless Service and its EndpointSlice naming `service_endpoints`: every
    # worker of the attempt has an address and the slice does not name them yet (written
    # earlier, it would be rewritten per worker's address), or it names workers that are
    # gone or of another attempt (lifecycle/endpoints.py).
    wants_service: bool = False
    service_endpoints: tuple[Published, ...] = ()
    # What the goodput decisions remember of the reports until the next poll
    # (lifecycle/goodput.py); the controller keeps it and passes it back in.
    memory: Memory | None = None
    # Nodes to annotate trainwave.io/straggler-until (node, until) before the gang that
    # ran there is recreated elsewhere.
    mark_nodes: tuple[tuple[str, datetime], ...] = ()


@dataclass
class Draft:
    """Status under construction, plus the actions that go with it."""

    meta: ObjectMeta
    now: datetime
    status: TrainingJobStatus
    create: list[int] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)
    force_delete: list[str] = field(default_factory=list)
    events: list[JobEvent] = field(default_factory=list)
    requeue_after: float | None = None
    delete_job: bool = False
    all_running_after: float | None = None
    wants_placement: bool = False
    workload: WorkloadAction = WorkloadAction.NONE
    wants_service: bool = False
    service_endpoints: tuple[Published, ...] = ()
    memory: Memory | None = None
    mark_nodes: list[tuple[str, datetime]] = field(default_factory=list)

    def update(self, **changes: object) -> None:
        self.status = self.status.model_copy(update=changes)

    def condition(self, kind: ConditionType, true: bool | None, reason: str, message: str) -> None:
        conditions = set_condition(
            list(self.status.conditions),
            kind,
            true=true,
            reason=reason,
            message=message,
            now=self.now,
            generation=self.meta.generation,
        )
        self.update(conditions=conditions)

    def clear(self, kind: ConditionType, reason: str, message: str) -> None:
        conditions = clear_condition(
            list(self.status.conditions),
            kind,
            reason=reason,
            message=message,
            now=self.now,
            generation=self.meta.generation,
        )
        self.update(conditions=conditions)

    def enter(self, phase: Phase, reason: str, message: str, *, warning: bool = False) -> None:
        """Move to `phase`; an Event is recorded for every change of phase."""
        if self.status.phase != phase:
            kind = "Warning" if warning else _EVENT_TYPES.get(phase, "Normal")
            self.events.append(JobEvent(kind, reason, message))
        self.update(phase=phase, reason=reason, message=message)

    def stop(self, pods: Sequence[WorkerPod]) -> None:
        self.delete.extend(p.name for p in pods if p.active)

    def requeue(self, seconds: float) -> None:
        seconds = max(seconds, 0.0)
        self.requeue_after = (
            seconds if self.requeue_after is None else min(self.requeue_after, seconds)
        )

    def finish(self) -> Decision:
        self.update(observed_generation=self.meta.generation)
        return Decision(
            status=self.status,
            create_ranks=tuple(self.create),
            delete_pods=tuple(n for n in dict.fromkeys(self.delete) if n not in self.force_delete),
            force_delete_pods=tuple(dict.fromkeys(self.force_delete)),
            events=tuple(self.events),
            requeue_after=self.requeue_after,
            delete_job=self.delete_job,
            all_running_after=self.all_running_after,
            wants_placement=self.wants_placement,
            workload=self.workload,
            wants_service=self.wants_service,
            service_endpoints=self.service_endpoints if self.wants_service else (),
            memory=self.memory,
            mark_nodes=tuple(self.mark_nodes),
        )


def fail(draft: Draft, reason: str, message: str) -> None:
    complete(draft, Phase.FAILED, reason, message)


def complete(draft: Draft, phase: Phase, reason: str, message: str) -> None:
    kind = ConditionType.SUCCEEDED if phase == Phase.SUCCEEDED else ConditionType.FAILED
    draft.condition(kind, True, reason, message)
    draft.clear(ConditionType.RUNNING, reason, message)
    draft.clear(ConditionType.RESTARTING, reason, message)
    draft.enter(phase, reason, message)
    draft.update(completion_time=draft.now, gpus=0, ready_workers=0)
    draft.update(ready=f"0/{draft.status.total_workers}")
