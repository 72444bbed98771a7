"""A gang restarted as a new attempt, or the job failed: each cause spends its own budget.

Pure. Per cause (lifecycle/failures.py `Cause`): the status counter it moves, its
budget in runPolicy.failurePolicy, and the reasons of the restart and of the failure
once the budget is spent. Disruptions never spend the user's maxRestarts.
"""

from datetime import timedelta

from trainwave.api.reasons import Reason
from trainwave.api.run_policy import MAX_BACKOFF_SECONDS
from trainwave.api.status import ConditionType, Phase
from trainwave.api.trainingjob import TrainingJob
from trainwave.backoff import Backoff
from trainwave.lifecycle.draft import Draft, fail
from trainwave.lifecycle.failures import Cause

# Per cause: the status counter, the budget in failurePolicy, the reasons of the
# restart and of the failure once the budget is spent.
_BUDGETS = {
    Cause.FAILURE: (
        "restarts",
        "max_restarts",
        "restart",
        Reason.WORKER_FAILED,
        Reason.MAX_RESTARTS_EXCEEDED,
    ),
    Cause.DISRUPTION: (
        "disruptions",
        "max_disruptions",
        "disruption",
        Reason.WORKER_DISRUPTED,
        Reason.MAX_DISRUPTIONS_EXCEEDED,
    ),
    Cause.HANG: (
        "restarts",
        "max_restarts",
        "restart",
        Reason.HUNG,
        Reason.MAX_RESTARTS_EXCEEDED,
    ),
    Cause.STRAGGLER: (
        "disruptions",
        "max_disruptions",
        "disruption",
        Reason.STRAGGLER_REPLACED,
        Reason.MAX_DISRUPTIONS_EXCEEDED,
    ),
    Cause.PREFLIGHT: (
        "disruptions",
        "max_disruptions",
        "disruption",
        Reason.PREFLIGHT_FAILED,
        Reason.MAX_DISRUPTIONS_EXCEEDED,
    ),
    Cause.IGNORED: (
        "ignored_restarts",
        "max_ignored_restarts",
        "ignored restart",
        Reason.FAILURE_IGNORED,
        Reason.MAX_IGNORED_RESTARTS_EXCEEDED,
    ),
}


def restart_or_fail(draft: Draft, job: TrainingJob, what: str, cause: Cause) -> None:
    policy = job.spec.run_policy.failure_policy
    counter, limit_field, label, reason, spent = _BUDGETS[cause]
    used: int = getattr(draft.status, counter)
    limit: int = getattr(policy, limit_field)
    if used >= limit:
        fail(
            draft,
            spent,
            f"{what} after {used} {label}(s); {_camel(limit_field)} is {limit}",
        )
        return
    draft.update(
        **{counter: used + 1},
        attempt=draft.status.attempt + 1,
        all_running_time=None,
        attempt_start_time=None,
    )
    message = f"{what}; restarting the gang ({label} {used + 1} of {limit})"
    if cause == Cause.IGNORED and policy.ignore_backoff_seconds:
        delay = ignore_backoff(policy.ignore_backoff_seconds, used + 1)
        draft.update(next_attempt_time=draft.now + timedelta(seconds=delay))
        draft.requeue(delay)
        message += f" in {delay}s"
    draft.condition(ConditionType.RESTARTING, True, reason, message)
    draft.clear(ConditionType.RUNNING, Reason.RESTARTING, message)
    draft.enter(Phase.RESTARTING, reason, message)


def ignore_backoff(first: int, nth: int) -> int:
    """Seconds before the nth Ignore restart: `first`, doubled each time, at most 300 s,
    as the kubelet backs off a crash-looping container."""
    # No jitter: the delay is a decision, written into the status as nextAttemptTime.
    return int(Backoff(base=first, cap=MAX_BACKOFF_SECONDS).delay(nth))


def _camel(snake: str) -> str:
    head, *rest = snake.split("_")
    return head + "".join(word.title() for word in rest)
