"""The job state machine: (job, observed workers, now) -> what to do next.

Pure and level-triggered: the decision depends only on what is observed now,
never on which event woke the operator, so replaying it after a crash at any
point converges to the same state without losing or duplicating work.

Invariants:
- Pods of attempt `status.attempt` are the gang; pods of any other attempt are
  stale and only ever deleted. An attempt's pods have deterministic names, so
  creating "missing" ones twice cannot duplicate a worker.
- `status.attempt` moves forward before any pod of the new attempt exists:
  the controller writes status first (guarded by resourceVersion), then pods.
- In a terminal phase nothing is created; active pods are stopped so GPUs
  return at once, finished pods stay for their logs until the TTL.
"""

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta

from trainwave.api.reasons import Reason
from trainwave.api.sharing import isolation
from trainwave.api.status import ConditionType, Phase, TrainingJobStatus
from trainwave.api.trainingjob import ObjectMeta, TrainingJob
from trainwave.lifecycle.admission import Admission, finish, gate, suspended
from trainwave.lifecycle.draft import Decision, Draft, JobEvent, PlacementWait, complete, fail
from trainwave.lifecycle.endpoints import published
from trainwave.lifecycle.failures import Cause, Incident, find_incidents, judge_failure
from trainwave.lifecycle.goodput import Memory
from trainwave.lifecycle.observed import NodeHealth, PodPhase, WorkerPod
from trainwave.lifecycle.overrides import overridden
from trainwave.lifecycle.placing import await_placement, bind_timed_out, record_placement
from trainwave.lifecycle.preflight import apply_preflight
from trainwave.lifecycle.replacing import (
    DISRUPTION,
    STRAGGLER,
    follow_replacements,
    judge_replacement,
    start_replacement,
    superseded,
)
from trainwave.lifecycle.reported import Repair, apply_reports
from trainwave.lifecycle.reports import WorkerReport, progress_status, rdma_verdict
from trainwave.lifecycle.restarts import restart_or_fail
from trainwave.resolving import ResolvedJob

__all__ = ["Decision", "JobEvent", "PlacementWait", "count_created", "decide", "decide_invalid"]


def decide(
    resolved: ResolvedJob,
    pods: Sequence[WorkerPod],
    now: datetime,
    waiting: PlacementWait | None = None,
    reports: Mapping[int, WorkerReport] | None = None,
    *,
    nodes: Mapping[str, NodeHealth] | None = None,
    admission: Admission | None = None,
    service_exists: bool = False,
    service_stale: bool = False,
    host_unpublished: bool = False,
    memory: Memory | None = None,
) -> Decision:
    """`resolved` is the job resolved once by the caller (resolving.py). `nodes`: the
    health of the workers' nodes, as far as the caller knows it (a node missing from it is
    not judged). `admission`: for a job queued in Kueue, its Workload as observed (None:
    not queued, runs as soon as placed). `service_exists`: whether the job's EndpointSlice
    names exactly this attempt's live workers; `service_stale`: whether it names others
    (written again at once; lifecycle/endpoints.py `service_state`); `host_unpublished`:
    whether worker 0 has an address no slice of the attempt names yet (written at once,
    before the other workers have theirs; `host_unpublished` there).
    `memory`: what the previous decision remembered of the reports (Decision.memory), for
    hangs and stragglers."""
    job = resolved.job
    draft = Draft(meta=job.metadata, now=now, status=job.status)
    mine = [p for p in pods if p.owner_uid == job.metadata.uid]
    kept_apart = _isolation(resolved)
    if draft.status.isolation != kept_apart:
        draft.update(isolation=kept_apart)
    if draft.status.phase is None:
        draft.condition(ConditionType.CREATED, True, Reason.CREATED, "job accepted")
        draft.enter(Phase.PENDING, Reason.CREATED, "job accepted")
    overridden(draft, resolved.overrides)
    phase = draft.status.phase
    if phase is not None and phase.terminal:
        _finished(draft, job, mine)
        finish(draft, admission)
    elif job.spec.run_policy.suspend:
        _suspend(draft, job, mine)
        suspended(draft, mine, admission)
    else:
        if phase == Phase.SUSPENDED:
            _resume(draft)
        if admission is None or gate(draft, job, mine, admission):
            _run(
                draft,
                job,
                mine,
                waiting,
                nodes or {},
                service_exists=service_exists,
                host_unpublished=host_unpublished,
            )
        else:
            _count(draft, job, [])
        if draft.status.phase is not None and draft.status.phase.terminal:
            finish(draft, admission)
        elif service_stale:
            # At once, before the new gang's pods exist: the names must not lead to the old
            # gang's workers, terminating, or to a replaced worker's old address.
            draft.wants_service = True
    if reports:
        _reported(draft, job, reports)
    phase = draft.status.phase
    if phase is not None and not phase.terminal:
        current = [p for p in mine if p.attempt == draft.status.attempt]
        draft.memory, repair = apply_reports(draft, job, current, reports or {}, memory)
        if repair is None:
            repair = apply_preflight(draft, job, current, reports or {})
        if repair is not None:
            _repair(draft, job, current, repair)
    draft.service_endpoints = published(mine, draft.status.attempt)
    return draft.finish()


def _repair(draft: Draft, job: TrainingJob, current: list[WorkerPod], repair: Repair) -> None:
    """A replaced straggler's worker alone where lifecycle/replacing.py allows; else the gang."""
    what = repair.what
    if repair.cause == Cause.STRAGGLER and repair.worker is not None:
        incident = Incident(repair.worker, "", what)
        alone = judge_replacement(job, draft.status, [incident], straggler=True)
        if alone.ranks:
            start_replacement(draft, job, alone, [incident], current, cause=STRAGGLER)
            return
        what += f"; not replaced alone: {alone.why_not}" if alone.why_not else ""
    draft.stop(current)
    restart_or_fail(draft, job, what, repair.cause)


def count_created(
    resolved: ResolvedJob,
    decision: Decision,
    pods: Sequence[WorkerPod],
    now: datetime,
    waiting: PlacementWait | None = None,
    *,
    service_exists: bool = False,
) -> Decision:
    """`decision`, which created workers of the attempt its status records and did nothing
    else (lifecycle/plan.py only_creates), with those workers counted: `pods` are the
    job's pods, the created ones among them. Nothing is decided again: the workers that
    existed are as `decision` saw them and the created ones are new, so only the count and
    the gang's progress move (behind the gate: Scheduling; placed at creation: waiting to
    be bound). Its events are those of that progress; `decision`'s own are the caller's."""
    job = resolved.job
    draft = Draft(meta=job.metadata, now=now, status=decision.status)
    draft.requeue_after, draft.memory = decision.requeue_after, decision.memory
    attempt = decision.status.attempt
    current = [p for p in pods if p.owner_uid == job.metadata.uid and p.attempt == attempt]
    _count(draft, job, current)
    _progress(draft, job, current, waiting, service_exists)
    draft.service_endpoints = published(current, attempt)
    return draft.finish()


def decide_invalid(
    meta: ObjectMeta,
    status: TrainingJobStatus,
    pods: Sequence[WorkerPod],
    message: str,
    now: datetime,
) -> Decision:
    """A spec the schema let through but that cannot run: Failed, InvalidSpec."""
    draft = Draft(meta=meta, now=now, status=status)
    if status.phase is None or not status.phase.terminal:
        fail(draft, Reason.INVALID_SPEC, message)
    draft.stop([p for p in pods if p.owner_uid == meta.uid])
    return draft.finish()


def _finished(draft: Draft, job: TrainingJob, mine: list[WorkerPod]) -> None:
    draft.stop(mine)
    ttl = job.spec.run_policy.ttl_seconds_after_finished
    done_at = draft.status.completion_time
    if ttl is None or done_at is None:
        return
    remaining = (done_at + timedelta(seconds=ttl) - draft.now).total_seconds()
    if remaining <= 0:
        draft.delete_job = True
    else:
        draft.requeue(remaining)


def _suspend(draft: Draft, job: TrainingJob, mine: list[WorkerPod]) -> None:
    draft.stop(mine)
    draft.condition(ConditionType.SUSPENDED, True, Reason.SUSPENDED, "runPolicy.suspend is true")
    draft.clear(ConditionType.RUNNING, Reason.SUSPENDED, "workers stopped by suspension")
    draft.enter(
        Phase.SUSPENDED, Reason.SUSPENDED, "workers stopped; set runPolicy.suspend: false to resume"
    )
    draft.update(start_time=None, all_running_time=None, attempt_start_time=None)
    _count(draft, job, [])


def _resume(draft: Draft) -> None:
    # A new attempt: the previous pods may still be terminating, and fresh names
    # keep the new gang clear of them. Resuming is not a counted restart.
    draft.update(attempt=draft.status.attempt + 1)
    draft.condition(ConditionType.SUSPENDED, False, Reason.RESUMED, "runPolicy.suspend is false")
    draft.enter(Phase.PENDING, Reason.RESUMED, "job resumed; starting a new gang")


def _run(
    draft: Draft,
    job: TrainingJob,
    mine: list[WorkerPod],
    waiting: PlacementWait | None,
    nodes: Mapping[str, NodeHealth],
    *,
    service_exists: bool,
    host_unpublished: bool,
) -> None:
    attempt = draft.status.attempt
    current = [p for p in mine if p.attempt == attempt]
    _clear_stale(draft, [p for p in mine if p.attempt != attempt])
    _count(draft, job, current)

    # Success first: under Rank0 the other ranks often fail once worker 0 (which
    # hosts the rendezvous store) exits, and that must not undo a finished job.
    # Under AllWorkers success and a failure cannot both be seen.
    if _succeeded(job, current):
        draft.stop(current)
        complete(draft, Phase.SUCCEEDED, Reason.SUCCEEDED, _success_message(job))
        return
    note = draft.status.preempted_by
    preemptor = note.preemptor if note is not None and note.attempt == attempt else ""
    preemptor = preemptor or next((p.preempted_by for p in current if p.preempted_by), "")
    if preemptor:
        _preempted(draft, job, current, preemptor)
        return
    flight = follow_replacements(draft, job, current)
    if flight.overdue:
        draft.stop(current)
        restart_or_fail(draft, job, flight.overdue, Cause.DISRUPTION)
        return
    # A replaced worker's old pod is neither trouble nor a worker of the gang any more.
    replaced = superseded(current)
    visible = [p for p in current if not (flight.hides(p) or p.name in replaced)]
    _count(draft, job, visible)
    incidents = find_incidents(
        visible,
        job.spec.workers,
        nodes,
        draft.now,
        job.spec.run_policy.failure_policy.node_not_ready_seconds,
        gang_formed=_gang_formed(draft) or bool(flight.ranks),
        replacing=flight.ranks,
    )
    if incidents.found:
        _on_failure(draft, job, incidents.found, current)
        return
    if incidents.recheck_after is not None:
        draft.requeue(incidents.recheck_after)
    if _past_deadline(draft, job):
        draft.stop(current)
        deadline = job.spec.run_policy.active_deadline_seconds
        fail(
            draft,
            Reason.DEADLINE_EXCEEDED,
            f"job ran longer than activeDeadlineSeconds ({deadline}s)",
        )
        return
    if _past_max_run(draft, current):
        draft.stop(current)
        seconds = max(p.max_run_seconds for p in current)
        fail(
            draft,
            Reason.DEADLINE_EXCEEDED,
            f"the gang ran longer than runPolicy.maxRunSeconds ({seconds}s) after it was placed",
        )
        return
    if _backing_off(draft):
        return

    # A replaced worker's new pod has a name of its own: created while the old one goes.
    present = {p.rank for p in visible} | {p.rank for p in current if flight.holds_name(p)}
    draft.create.extend(r for r in range(job.spec.workers) if r not in present)
    # Workers of the attempt and no start time at all: their status was lost after they
    # were created (a write that failed, an operator restarted before writing a held
    # status). The job and this attempt started no later than now.
    lost = bool(current) and draft.status.start_time is None
    if (draft.create or lost) and draft.status.start_time is None:
        draft.update(start_time=draft.now)
        _past_deadline(draft, job)  # only to schedule the deadline's wake-up
    if (draft.create or lost) and draft.status.attempt_start_time is None:
        draft.update(attempt_start_time=draft.now)
    _progress(draft, job, visible, waiting, service_exists, host_unpublished=host_unpublished)


def _gang_formed(draft: Draft) -> bool:
    """Whether every worker of the attempt was seen: the phase leaves Pending only then.

    The operator deletes pods of the current attempt only after moving on from
    it, so a worker missing or deleted after that was taken by someone else.
    """
    return draft.status.phase in (Phase.SCHEDULING, Phase.STARTING, Phase.RUNNING)


def _backing_off(draft: Draft) -> bool:
    """Hold back the next gang until status.nextAttemptTime (after an Ignore restart)."""
    until = draft.status.next_attempt_time
    if until is None:
        return False
    remaining = (until - draft.now).total_seconds()
    if remaining <= 0:
        draft.update(next_attempt_time=None)
        return False
    draft.requeue(remaining)
    return True


def _preempted(draft: Draft, job: TrainingJob, current: list[WorkerPod], preemptor: str) -> None:
    """A higher-priority gang took the room: restart later as a new attempt, uncounted."""
    message = f"preempted by {preemptor}, a gang of higher priority; waiting to start again"
    draft.stop(current)
    draft.update(
        attempt=draft.status.attempt + 1,
        preemptions=draft.status.preemptions + 1,
        last_preemption_time=draft.now,
        all_running_time=None,
        attempt_start_time=None,
        placement=None,
        preempted_by=None,
    )
    draft.condition(ConditionType.PREEMPTED, True, Reason.PREEMPTED, message)
    draft.clear(ConditionType.RUNNING, Reason.PREEMPTED, message)
    draft.enter(Phase.PENDING, Reason.PREEMPTED, message, warning=True)


def _on_failure(
    draft: Draft, job: TrainingJob, incidents: list[Incident], current: list[WorkerPod]
) -> None:
    verdict = judge_failure(job.spec.run_policy.failure_policy, incidents)
    what = verdict.describe()
    if verdict.action == "RestartGang":
        ruled = verdict.rule_index is not None
        alone = judge_replacement(job, draft.status, incidents, rule_matched=ruled)
        if alone.ranks:
            start_replacement(draft, job, alone, incidents, current, cause=DISRUPTION)
            return
        what += f"; not replaced alone: {alone.why_not}" if alone.why_not else ""
    draft.stop(current)
    if verdict.action == "FailJob":
        fail(draft, Reason.FAILED_BY_RULE, f"{what}; the job failed")
        return
    restart_or_fail(draft, job, what, verdict.cause)


def _progress(
    draft: Draft,
    job: TrainingJob,
    current: list[WorkerPod],
    waiting: PlacementWait | None,
    service_exists: bool,
    *,
    host_unpublished: bool = False,
) -> None:
    total = job.spec.workers
    existing = [p for p in current if not p.deleting]
    bound = sum(1 for p in existing if p.bound)
    running = [p for p in existing if p.phase in (PodPhase.RUNNING, PodPhase.SUCCEEDED)]
    if len(existing) < total:
        if draft.status.phase != Phase.RESTARTING:
            draft.enter(
                Phase.PENDING, Reason.CREATING_WORKERS, f"{len(existing)}/{total} workers created"
            )
        return
    # Written once every worker has an address, and before that as soon as worker 0 has one
    # (its name is the rendezvous endpoint: lifecycle/endpoints.py `host_unpublished`).
    # Until then a refusal of it stays on the job.
    service_due = not service_exists and (
        host_unpublished or all(p.bound and p.pod_ip for p in existing)
    )
    if draft.status.condition(ConditionType.REPLICA_FAILURE) is not None and not service_due:
        draft.clear(ConditionType.REPLICA_FAILURE, Reason.CREATED, f"all {total} workers created")
    if any(p.gated for p in existing):
        await_placement(draft, job, existing, waiting)
        return
    record_placement(draft, existing)
    if bound < total:
        if bind_timed_out(draft, job, existing):
            return
        message = f"{bound}/{total} workers bound to nodes" + _why_not_started(existing)
        draft.condition(ConditionType.SCHEDULED, False, Reason.WAITING_FOR_NODES, message)
        draft.enter(Phase.SCHEDULING, Reason.WAITING_FOR_NODES, message)
        return
    draft.condition(
        ConditionType.SCHEDULED, True, Reason.ALL_WORKERS_BOUND, f"{total} workers bound"
    )
    draft.wants_service = service_due
    if len(running) < total:
        message = f"{len(running)}/{total} workers running" + _why_not_started(existing)
        draft.enter(Phase.STARTING, Reason.WORKERS_STARTING, message)
        return
    if draft.status.phase != Phase.RUNNING:
        started = draft.status.attempt_start_time or draft.status.start_time or draft.now
        draft.all_running_after = max((draft.now - started).total_seconds(), 0.0)
        draft.update(all_running_time=draft.now)
    draft.condition(
        ConditionType.RUNNING, True, Reason.ALL_WORKERS_RUNNING, f"{total} workers running"
    )
    draft.clear(ConditionType.RESTARTING, Reason.ALL_WORKERS_RUNNING, "the gang is running again")
    draft.enter(Phase.RUNNING, Reason.ALL_WORKERS_RUNNING, f"{total} workers running")


def _why_not_started(existing: list[WorkerPod]) -> str:
    """ "; worker <rank> (<pod>): <why>" for the lowest rank that says why it does not start,
    else "". A pod kube-scheduler cannot place, a container the kubelet cannot start (a
    mistyped image, a missing Secret), a pod it cannot set up (a volume that does not
    mount) or whose image it is still pulling: each keeps the gang waiting, as a Job's pod
    stays Pending, so the job says which worker and why."""
    said = sorted(
        (p.rank, p.name, p.stuck or p.event_says) for p in existing if p.stuck or p.event_says
    )
    if not said:
        return ""
    rank, name, why = said[0]
    return f"; worker {rank} ({name}): {why}"


def _reported(draft: Draft, job: TrainingJob, reports: Mapping[int, WorkerReport]) -> None:
    """Progress from rank 0's runtime; RDMAVerified when the job asked for RDMA."""
    progress = progress_status(reports)
    if progress is not None:
        draft.update(progress=progress)
    network = job.spec.network
    if network is not None and network.rdma is not None:
        status, reason, message = rdma_verdict(reports, job.spec.workers)
        true = {"True": True, "False": False}.get(status)
        draft.condition(ConditionType.RDMA_VERIFIED, true, reason, message)


def _isolation(resolved: ResolvedJob) -> str:
    # From the same resolved setup the pods are built from (builders/sharing.py).
    return isolation(resolved.setup)


def _clear_stale(draft: Draft, stale: list[WorkerPod]) -> None:
    """Stop stale workers; keep the finished pods of the last attempt for their logs."""
    draft.stop(stale)
    oldest_kept = draft.status.attempt - 1
    draft.delete.extend(p.name for p in stale if p.attempt < oldest_kept and not p.deleting)


def _count(draft: Draft, job: TrainingJob, current: list[WorkerPod]) -> None:
    total = job.spec.workers
    ready = sum(1 for p in current if p.phase == PodPhase.RUNNING and p.ready and not p.deleting)
    holding = sum(1 for p in current if p.active)
    draft.update(
        ready_workers=ready,
        total_workers=total,
        ready=f"{ready}/{total}",
        gpus=holding * job.spec.gpus_per_worker,
    )


def _succeeded(job: TrainingJob, current: list[WorkerPod]) -> bool:
    done = {p.rank for p in current if p.phase == PodPhase.SUCCEEDED}
    if job.spec.run_policy.success_policy == "Rank0":
        return 0 in done
    return len(done) == job.spec.workers and done == set(range(job.spec.workers))


def _success_message(job: TrainingJob) -> str:
    if job.spec.run_policy.success_policy == "Rank0":
        return "worker 0 completed (successPolicy Rank0)"
    workers = job.spec.workers
    return f"all {workers} workers completed" if workers > 1 else "the worker completed"


def _past_max_run(draft: Draft, current: list[WorkerPod]) -> bool:
    """Whether the gang of this attempt reached runPolicy.maxRunSeconds, counted from its
    first release (the pods carry the bound: the queue's backfill counted on the same)."""
    ends = [end for p in current if not p.finished and (end := p.run_until) is not None]
    if not ends:
        return False
    remaining = (min(ends) - draft.now).total_seconds()
    if remaining > 0:
        draft.requeue(remaining)
        return False
    return True


def _past_deadline(draft: Draft, job: TrainingJob) -> bool:
    deadline = job.spec.run_policy.active_deadline_seconds
    started = draft.status.start_time
    if deadline is None or started is None:
        return False
    remaining = (started + timedelta(seconds=deadline) - draft.now).total_seconds()
    if remaining > 0:
        draft.requeue(remaining)
        return False
    return True
