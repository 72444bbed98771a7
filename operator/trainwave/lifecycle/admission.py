"""Kueue admission of a queued job: (job, its Workload) -> hold, run, or give the quota back.

Pure. A TrainingJob labelled `kueue.x-k8s.io/queue-name` runs only while Kueue
admits its Workload. Kueue knows TrainingJob only as an external framework,
which marks the kind and nothing more: Kueue never creates, suspends or resumes
it, so trainwave plays the part Kueue's jobframework plays for the kinds Kueue
knows (pkg/controller/jobframework/reconciler.go, ReconcileGenericJob, v0.11.9):

- no Workload yet: create it (builders/workload.py) and wait, phase Pending,
  reason Queued;
- QuotaReserved/Admitted not True: no gang exists; one that did is stopped, as
  jobframework suspends a job whose Workload lost its admission;
- Admitted=True: the gang runs, inside the admitted flavors' node labels and
  tolerations (`with_flavors`, after podset.FromAssignment + Merge);
- Evicted=True while quota is still reserved (preemption, a stopped queue...):
  stop the gang; Kueue keeps the quota until the owner gives it back, which
  jobframework does only once the job has no active pods
  (workload.UnsetQuotaReservationWithCondition); so does `release_conditions`.
  A gang that had started begins a new attempt that is not a counted restart;
- the job ended: Finished=True, reason Succeeded or Failed, frees the quota;
- runPolicy.suspend: the Workload is deactivated (spec.active false), the way
  Kueue's users stop a Workload; Kueue evicts it (InactiveWorkload) and the quota
  is given back as after any eviction. Resuming activates it again.

Invariant: an eviction moves the attempt at most once. Once moved, the new
attempt has no pods and no start time, so seeing the same eviction again (the
quota not yet given back) only stops and releases.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from trainwave import contract
from trainwave.api.reasons import Reason
from trainwave.api.status import ConditionType, Phase
from trainwave.api.trainingjob import TrainingJob
from trainwave.lifecycle.draft import Draft, JobEvent
from trainwave.lifecycle.observed import WorkerPod
from trainwave.lifecycle.workload_actions import WorkloadAction

# Workload condition types and the reasons Kueue reads (apis/kueue/v1beta1/workload_types.go).
QUOTA_RESERVED = "QuotaReserved"
ADMITTED = "Admitted"
EVICTED = "Evicted"
FINISHED = "Finished"
REQUEUED = "Requeued"
KUEUE_PREEMPTED = "Preempted"


@dataclass(frozen=True)
class Flavor:
    """A ResourceFlavor: where its quota lives (nodeLabels) and what it tolerates."""

    name: str
    node_labels: Mapping[str, str]
    tolerations: tuple[Mapping[str, Any], ...] = ()


@dataclass(frozen=True)
class Workload:
    """What trainwave reads of the Workload it owns, from the watch."""

    name: str
    owner_uid: str
    resource_version: str
    queue: str
    conditions: tuple[Mapping[str, Any], ...] = ()
    cluster_queue: str = ""
    flavors: tuple[str, ...] = ()  # the admission's flavors for the workers, in resource order
    active: bool = True  # spec.active

    def condition(self, kind: str) -> Mapping[str, Any] | None:
        return next((c for c in self.conditions if c.get("type") == kind), None)

    def holds(self, kind: str) -> bool:
        found = self.condition(kind)
        return found is not None and found.get("status") == "True"

    @property
    def evicted(self) -> bool:
        """Evicted while the quota is still reserved: the owner must stop and give it back."""
        return self.holds(EVICTED) and self.holds(QUOTA_RESERVED)

    @property
    def admitted(self) -> bool:
        return self.holds(ADMITTED) and not self.evicted and not self.holds(FINISHED)


@dataclass(frozen=True)
class Admission:
    """A queued job's admission as observed: its LocalQueue and its Workload (None: none yet)."""

    queue: str
    workload: Workload | None
    # Flavors the Workload was admitted to that the caller has not seen yet: without
    # their node labels the gang cannot be placed inside them, so it waits.
    flavors_missing: tuple[str, ...] = ()


def queue_of(job: TrainingJob) -> str:
    return job.metadata.labels.get(contract.KUEUE_QUEUE_LABEL, "")


def observe_workload(obj: Mapping[str, Any]) -> Workload | None:
    """The record kept of a Workload; None for one not owned by a TrainingJob."""
    meta = obj.get("metadata") or {}
    owner = next(
        (
            o
            for o in meta.get("ownerReferences") or []
            if o.get("kind") == contract.KIND and o.get("apiVersion") == contract.API_VERSION
        ),
        None,
    )
    if owner is None:
        return None
    status = obj.get("status") or {}
    admission = status.get("admission") or {}
    flavors: list[str] = []
    for assignment in admission.get("podSetAssignments") or []:
        for flavor in (assignment.get("flavors") or {}).values():
            if flavor not in flavors:
                flavors.append(str(flavor))
    return Workload(
        name=str(meta.get("name", "")),
        owner_uid=str(owner.get("uid", "")),
        resource_version=str(meta.get("resourceVersion", "")),
        queue=str((obj.get("spec") or {}).get("queueName", "")),
        conditions=tuple(dict(c) for c in status.get("conditions") or []),
        cluster_queue=str(admission.get("clusterQueue", "")),
        flavors=tuple(flavors),
        active=(obj.get("spec") or {}).get("active", True) is not False,
    )


def gate(draft: Draft, job: TrainingJob, mine: list[WorkerPod], admission: Admission) -> bool:
    """Whether the gang may run now; otherwise the draft holds, stops or releases."""
    workload = admission.workload
    if workload is None:
        draft.workload = WorkloadAction.CREATE
        _hold(draft, mine, _waiting(admission.queue, "creating its Workload"))
        return False
    if workload.evicted:
        _evicted(draft, mine, workload)
        return False
    if not workload.active:
        draft.workload = WorkloadAction.ACTIVATE
        _hold(draft, mine, _waiting(admission.queue, "reactivating its Workload"))
        return False
    if not workload.admitted:
        pending = workload.condition(QUOTA_RESERVED) or {}
        kueue_says = str(pending.get("message", ""))
        message = _waiting(admission.queue, kueue_says)
        _kueue_reason(draft, kueue_says, message)
        _hold(draft, mine, message)
        return False
    if admission.flavors_missing:
        missing = ", ".join(admission.flavors_missing)
        _hold(draft, mine, _waiting(admission.queue, f"ResourceFlavor {missing} not seen yet"))
        return False
    message = f"admitted by ClusterQueue {workload.cluster_queue} (Workload {workload.name})"
    if workload.flavors:
        message += f", flavor {', '.join(workload.flavors)}"
    _announce(draft, True, Reason.ADMITTED, message)
    draft.condition(ConditionType.ADMITTED, True, Reason.ADMITTED, message)
    return True


def suspended(draft: Draft, mine: list[WorkerPod], admission: Admission | None) -> None:
    """A suspended job holds no quota: deactivate its Workload, then give back what Kueue
    evicts (the workers are already being stopped by the suspension)."""
    workload = admission.workload if admission is not None else None
    if workload is None:
        return
    if workload.active:
        draft.workload = WorkloadAction.DEACTIVATE
    elif workload.evicted and all(p.finished for p in mine):
        draft.workload = WorkloadAction.RELEASE


def finish(draft: Draft, admission: Admission | None) -> None:
    """A finished job gives its quota back (Finished=True), once."""
    workload = admission.workload if admission is not None else None
    if workload is not None and not workload.holds(FINISHED):
        draft.workload = WorkloadAction.FINISH


def _waiting(queue: str, detail: str) -> str:
    message = f"waiting for Kueue admission in LocalQueue {queue}"
    return f"{message}: {detail}" if detail else message


def _hold(draft: Draft, mine: list[WorkerPod], message: str) -> None:
    _take_back(draft, mine, Reason.QUEUED, f"admission withdrawn; {message}", counted=False)
    _announce(draft, False, Reason.QUEUED, message)
    draft.condition(ConditionType.ADMITTED, False, Reason.QUEUED, message)
    after_eviction = draft.status.phase == Phase.PENDING and draft.status.reason in (
        Reason.PREEMPTED,
        Reason.EVICTED,
    )
    if after_eviction:
        # Keep why the gang went (Preempted, Evicted) in view, with what it waits for now.
        draft.update(message=message)
    else:
        draft.enter(Phase.PENDING, Reason.QUEUED, message)


def _announce(draft: Draft, admitted: bool, reason: Reason, message: str) -> None:
    """An Event when the Admitted condition turns (the phase often stays Pending, and
    phase changes are what post Events otherwise); Kueue's changing pending message
    while it stays queued posts none."""
    previous = draft.status.condition(ConditionType.ADMITTED)
    turned = previous is None or (previous.status == "True") != admitted
    if turned and not any(e.reason == reason for e in draft.events):
        draft.events.append(JobEvent("Normal", reason, message))


def _kueue_reason(draft: Draft, kueue_says: str, message: str) -> None:
    """An Event carrying Kueue's own words on why the job still waits (its Workload's
    QuotaReserved message: "couldn't assign flavors to pod set worker: insufficient
    unused quota for nvidia.com/gpu in flavor ..., 8 more needed"), where `kubectl
    describe` readers look, when that reason changes. Posted on change, never on a
    resync, as the other Events are: the job's Admitted condition keeps the last
    message, and only a change of its gist posts again. The gist leaves the numbers
    out, so "8 more needed" turning "4 more needed" as other jobs come and go is the
    same reason; another resource, flavor or kind of refusal is a new one. A reason
    that keeps flapping is held to a few Events a minute by the recorder
    (controller/handlers.py EVENT_RATES)."""
    if not kueue_says or any(e.reason == Reason.QUEUED for e in draft.events):
        return
    previous = draft.status.condition(ConditionType.ADMITTED)
    if previous is None or previous.status == "True":
        return  # _announce posts the turn to waiting, with this message
    if _gist(previous.message) != _gist(message):
        draft.events.append(JobEvent("Normal", Reason.KUEUE_PENDING, message))


def _gist(message: str) -> str:
    return re.sub(r"\d+(\.\d+)?", "N", message)


def _evicted(draft: Draft, mine: list[WorkerPod], workload: Workload) -> None:
    evicted = workload.condition(EVICTED) or {}
    why = str(evicted.get("message") or evicted.get("reason") or "evicted")
    preempted = evicted.get("reason") == KUEUE_PREEMPTED
    reason = Reason.PREEMPTED if preempted else Reason.EVICTED
    message = f"{'preempted' if preempted else 'evicted'} by Kueue: {why}; queued again"
    _take_back(draft, mine, reason, message, counted=preempted)
    draft.condition(ConditionType.ADMITTED, False, reason, message)
    if all(p.finished for p in mine):
        # Only now, as jobframework does: the preemptor must not start on top of our pods.
        draft.workload = WorkloadAction.RELEASE


def _take_back(
    draft: Draft, mine: list[WorkerPod], reason: str, message: str, *, counted: bool
) -> None:
    """Stop every worker; a gang that had started becomes a new attempt, never a counted
    restart (preemptions counts Kueue's preemptions, as it counts trainwave's own)."""
    draft.stop(mine)
    attempt = draft.status.attempt
    started = draft.status.attempt_start_time is not None or any(p.attempt == attempt for p in mine)
    if not started:
        return
    draft.update(
        attempt=attempt + 1,
        all_running_time=None,
        attempt_start_time=None,
        placement=None,
        preemptions=draft.status.preemptions + (1 if counted else 0),
        last_preemption_time=draft.now if counted else draft.status.last_preemption_time,
    )
    if counted:
        draft.condition(ConditionType.PREEMPTED, True, reason, message)
    draft.clear(ConditionType.RUNNING, reason, message)
    draft.clear(ConditionType.SCHEDULED, reason, message)
    draft.enter(Phase.PENDING, reason, message, warning=True)


def with_flavors(job: TrainingJob, flavors: Sequence[Flavor]) -> TrainingJob:
    """The job as its admitted gang must run: the flavors' node labels merged into the
    template's nodeSelector and their tolerations appended (podset.FromAssignment).

    On a conflicting key the flavor wins, so the gang lands where its quota was counted
    (Kueue's jobframework refuses to start such a job instead)."""
    if not flavors:
        return job
    spec = copy.deepcopy(job.spec.template.spec)
    selector = dict(spec.get("nodeSelector") or {})
    tolerations = list(spec.get("tolerations") or [])
    for flavor in flavors:
        selector.update(flavor.node_labels)
        tolerations.extend(dict(t) for t in flavor.tolerations if dict(t) not in tolerations)
    if selector:
        spec["nodeSelector"] = selector
    if tolerations:
        spec["tolerations"] = tolerations
    template = job.spec.template.model_copy(update={"spec": spec})
    return job.model_copy(update={"spec": job.spec.model_copy(update={"template": template})})


def released_conditions(workload: Workload, now: datetime) -> list[dict[str, Any]]:
    """The Workload's conditions once its quota is given back, as
    workload.UnsetQuotaReservationWithCondition writes them: QuotaReserved=False
    (Pending, with the eviction's message), Admitted=False (NoReservation), and
    Requeued with the eviction's reason, True only after a preemption (after any other
    eviction Kueue itself requeues it, e.g. once a stopped queue runs again)."""
    evicted = workload.condition(EVICTED) or {}
    message = str(evicted.get("message", "")) or "evicted"
    reason = str(evicted.get("reason", "")) or EVICTED
    requeued = "True" if reason == KUEUE_PREEMPTED else "False"
    updates = {
        QUOTA_RESERVED: ("False", "Pending", message),
        ADMITTED: ("False", "NoReservation", "The workload has no reservation"),
        REQUEUED: (requeued, reason, message),
    }
    return _set_conditions(workload.conditions, updates, now)


def finished_conditions(
    workload: Workload, succeeded: bool, message: str, now: datetime
) -> list[dict[str, Any]]:
    reason = "Succeeded" if succeeded else "Failed"
    return _set_conditions(workload.conditions, {FINISHED: ("True", reason, message)}, now)


def _set_conditions(
    conditions: Sequence[Mapping[str, Any]],
    updates: Mapping[str, tuple[str, str, str]],
    now: datetime,
) -> list[dict[str, Any]]:
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    result = [dict(c) for c in conditions if c.get("type") not in updates]
    for kind, (status, reason, message) in updates.items():
        old = next((c for c in conditions if c.get("type") == kind), None)
        moved = old is None or old.get("status") != status
        kept = old.get("lastTransitionTime", stamp) if old is not None else stamp
        result.append(
            {
                "type": kind,
                "status": status,
                "reason": reason,
                "message": message,
                "lastTransitionTime": stamp if moved else kept,
            }
        )
    return result
