"""What the workers' reports make of a running job: Hung, Straggler, status.goodput. Pure.

Applies lifecycle/goodput.py's verdicts to the draft: conditions that change only
when their verdict does (a status write costs the API server; a verdict that
stands writes nothing new), an Event on each transition, and a `Repair` for
decide.py to carry out when the launchers could not fix a hang themselves.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta

from trainwave import contract
from trainwave.api.reasons import Reason
from trainwave.api.status import ConditionType, GoodputStatus, Phase
from trainwave.api.trainingjob import TrainingJob
from trainwave.lifecycle.draft import Draft, JobEvent
from trainwave.lifecycle.failures import Cause
from trainwave.lifecycle.goodput import (
    Memory,
    Straggler,
    account,
    judge_hang,
    observe,
    stragglers,
)
from trainwave.lifecycle.observed import WorkerPod
from trainwave.lifecycle.reports import WorkerReport


@dataclass(frozen=True)
class Repair:
    """Recreate the gang: what happened, and the cause it is counted under."""

    cause: Cause
    what: str
    worker: int | None = None  # the one worker at fault, when the repair may replace it alone


def _rejoining(draft: Draft, timeout: int | None) -> bool:
    """A worker replacement ended within the last hang timeout: the gang's ranks start
    again (goodput.observe). Past that window (an operator restarted long after) the
    usual clock holds."""
    replaced = draft.status.condition(ConditionType.WORKER_REPLACEMENT)
    if timeout is None or replaced is None or replaced.status != "False":
        return False
    if replaced.reason != Reason.WORKER_REPLACED or replaced.last_transition_time is None:
        return False
    return (draft.now - replaced.last_transition_time).total_seconds() < timeout


def apply_reports(
    draft: Draft,
    job: TrainingJob,
    current: Sequence[WorkerPod],
    reports: Mapping[int, WorkerReport],
    memory: Memory | None,
) -> tuple[Memory | None, Repair | None]:
    """For a gang in phase Running: the next memory and a repair, if one is due. In any
    other phase the job's Hung and Straggler conditions are cleared: they were about a
    gang that no longer runs. With no rank reported at all (no runtime, or an operator
    that restarted and has not read the workers yet) nothing is judged or changed."""
    if draft.status.phase != Phase.RUNNING:
        _clear(draft, ConditionType.HUNG, Reason.PROGRESS_RESUMED, "the gang is not running")
        _clear(draft, ConditionType.STRAGGLER, Reason.NO_STRAGGLER, "the gang is not running")
        return None, None
    if not any(report.ranks for report in reports.values()):
        return memory, None
    run_policy = job.spec.run_policy
    timeout = run_policy.hang_timeout_seconds
    hung = draft.status.condition(ConditionType.HUNG)
    hung_since = hung.last_transition_time if hung is not None and hung.status == "True" else None
    stalled_since = None
    if hung_since is not None and timeout is not None:
        stalled_since = hung_since - timedelta(seconds=timeout)
    memory = observe(
        memory,
        draft.status.attempt,
        reports,
        draft.now,
        run_policy.stragglers,
        stalled_since=stalled_since,
        rejoining=_rejoining(draft, timeout),
    )
    goodput = account(
        draft.status.goodput,
        memory,
        reports,
        draft.now,
        start_time=draft.status.start_time,
        attempt_start_time=draft.status.attempt_start_time,
    )
    if goodput != draft.status.goodput:
        _in_place_news(draft, job, draft.status.goodput, goodput)
        draft.update(goodput=goodput)
    named = stragglers(memory, run_policy.stragglers)
    _stragglers(draft, current, named)
    if named and run_policy.stragglers.replace:
        repair = _replace_straggler(draft, job, current, named)
        if repair is not None:
            return memory, repair
    verdict = judge_hang(memory, timeout, draft.now, hung_since)
    if verdict is None:
        why = "hangTimeoutSeconds is unset" if timeout is None else "no rank has reported a step"
        _clear(draft, ConditionType.HUNG, Reason.PROGRESS_RESUMED, why)
        return memory, None
    if verdict.recheck_after is not None:
        draft.requeue(verdict.recheck_after)
    if not verdict.hung:
        if hung_since is not None:
            message = f"training progresses again: {verdict.message}"
            draft.condition(ConditionType.HUNG, False, Reason.PROGRESS_RESUMED, message)
            draft.events.append(JobEvent("Normal", Reason.PROGRESS_RESUMED, message))
        return memory, None
    if hung_since is None:
        draft.condition(ConditionType.HUNG, True, Reason.HUNG, verdict.message)
        draft.events.append(JobEvent("Warning", Reason.HUNG, verdict.message))
    if hung_since is None and not _launchers_restart(job):
        # Nobody else will act: without in-place restarts the launchers run no watchdog
        # (builders/runtime.py in_place_env), so a second timeout would only idle the gang.
        what = (
            f"the gang is hung and its launchers do not restart it in place "
            f"(spec.runtime.inPlaceRestarts is 0): {verdict.message}"
        )
    elif not verdict.recreate:
        return memory, None
    else:
        what = (
            f"the gang is still hung {timeout}s after it was found hung (the launchers did "
            f"not restart it in place): {verdict.message}"
        )
    draft.condition(ConditionType.HUNG, False, Reason.HUNG, f"gang recreated: {verdict.message}")
    return memory, Repair(Cause.HANG, what)


def _launchers_restart(job: TrainingJob) -> bool:
    """Whether the workers' launchers restart hung processes in place: their watchdog
    runs only with in-place restarts on."""
    runtime = job.spec.runtime
    return runtime is not None and runtime.enabled and runtime.in_place_restarts > 0


def _in_place_news(
    draft: Draft, job: TrainingJob, before: GoodputStatus | None, after: GoodputStatus | None
) -> None:
    """A Warning Event for in-place restarts newly counted: the gang kept its pods, so no
    phase changes and this is the only news of the fault."""
    if after is None or after.counted is None:
        return
    old_total = before.in_place_restarts if before is not None else 0
    if after.in_place_restarts <= old_total:
        return
    old_causes = before.in_place_restart_causes if before is not None else {}
    causes = [
        cause
        for cause, count in sorted(after.in_place_restart_causes.items())
        if count > old_causes.get(cause, 0)
    ]
    runtime = job.spec.runtime
    limit = f" of {runtime.in_place_restarts}" if runtime is not None else ""
    message = (
        f"training processes restarted inside the running pods "
        f"(cause {', '.join(causes) or 'unknown'}): {after.counted.in_place_restarts}{limit} "
        f"in-place restarts of this gang used; {after.steps_lost} steps lost so far"
    )
    draft.events.append(JobEvent("Warning", Reason.RESTARTED_IN_PLACE, message))


def _replace_straggler(
    draft: Draft, job: TrainingJob, current: Sequence[WorkerPod], named: list[Straggler]
) -> Repair | None:
    """Mark the slowest straggler's node and replace its worker (the placer keeps new pods
    off a marked node until the mark expires): that worker alone where lifecycle/replacing.py
    allows, else the whole gang, counted as a disruption either way. With maxDisruptions
    spent the straggler is only reported: a job never fails for being slow."""
    pods = {p.rank: p for p in current}
    found = next(
        ((s, pods[s.worker]) for s in named if s.worker in pods and pods[s.worker].node), None
    )
    if found is None:
        return None
    straggler, pod = found
    policy = job.spec.run_policy.failure_policy
    if draft.status.disruptions >= policy.max_disruptions:
        return None
    until = draft.now + timedelta(seconds=contract.STRAGGLER_MARK_SECONDS)
    draft.mark_nodes.append((pod.node, until))
    what = (
        f"{_describe(straggler, pod)}; node {pod.node} is marked "
        f"{contract.ANNOTATION_STRAGGLER_UNTIL}={until.isoformat().replace('+00:00', 'Z')} "
        "and its worker is placed elsewhere"
    )
    draft.condition(ConditionType.STRAGGLER, False, Reason.STRAGGLER_REPLACED, what)
    return Repair(Cause.STRAGGLER, what, worker=pod.rank)


def _stragglers(draft: Draft, current: Sequence[WorkerPod], named: list[Straggler]) -> None:
    if not named:
        _clear(draft, ConditionType.STRAGGLER, Reason.NO_STRAGGLER, "no rank is slower")
        return
    pods = {p.rank: p for p in current}
    described = [_describe(s, pods.get(s.worker)) for s in named]
    message = "; ".join(described[:8]) + (f"; and {len(named) - 8} more" if len(named) > 8 else "")
    before = draft.status.condition(ConditionType.STRAGGLER)
    if before is None or before.status != "True" or before.message != message:
        draft.condition(ConditionType.STRAGGLER, True, Reason.STRAGGLER, message)
        known = _named_in(before.message if before and before.status == "True" else "")
        for straggler, text in zip(named, described, strict=True):
            if straggler.rank not in known:
                draft.events.append(JobEvent("Warning", Reason.STRAGGLER, text))


def _describe(straggler: Straggler, pod: WorkerPod | None) -> str:
    where = f" (pod {pod.name}, node {pod.node or 'unknown'})" if pod is not None else ""
    what = "compute time" if straggler.signal == "compute" else "time"
    return (
        f"rank {straggler.rank}{where} is {straggler.slowdown:.1f}x the gang's median "
        f"{what} per step"
    )


def _named_in(message: str) -> set[int]:
    """The ranks a Straggler message names ("rank 3 (pod ...) is ..."), so an Event is
    posted once per newly named rank even after the operator restarted."""
    found = set()
    for part in message.split("; "):
        words = part.split()
        if len(words) > 1 and words[0] == "rank" and words[1].isdigit():
            found.add(int(words[1]))
    return found


def _clear(draft: Draft, kind: ConditionType, reason: str, message: str) -> None:
    """False, only when it is True now: an unchanged condition writes nothing."""
    found = draft.status.condition(kind)
    if found is not None and found.status == "True":
        draft.condition(kind, False, reason, message)
