"""When the API server refuses a worker or the job's Service: say so on the job. Pure.

Mirrors ReplicaSet's `ReplicaFailure` condition (reason FailedCreate, the API
server's own words as message, a Warning Event): a quota that is exhausted, a
forbidden pod, a webhook that refuses it. The phase stays what it was (the job
is not failed: a quota may free up), `status.reason`/`message` carry the
refusal so `kubectl get tj -o wide` shows it, and the reconcile is retried
with backoff. Once every worker exists, decide() turns the condition False.
"""

from datetime import datetime

from trainwave.api.reasons import Reason
from trainwave.api.status import ConditionType, TrainingJobStatus
from trainwave.api.trainingjob import ObjectMeta
from trainwave.lifecycle.draft import Decision, Draft, JobEvent

FAILED_CREATE = Reason.FAILED_CREATE


def creating_failed(
    meta: ObjectMeta,
    status: TrainingJobStatus,
    what: str,
    error: str,
    now: datetime,
    *,
    explanation: str = "",
) -> Decision:
    """`what` names the object ("pod demo-a0-worker-1"), `error` is the API server's message,
    `explanation` what trainwave knows about it (lifecycle/podsecurity.py)."""
    draft = Draft(meta=meta, now=now, status=status)
    message = f"creating {what} failed: {error}"
    if explanation:
        # First, so the Event (its note is cut at 1,024 characters) still carries it.
        message = f"creating {what} failed: {explanation}; the API server said: {error}"
    previous = status.condition(ConditionType.REPLICA_FAILURE)
    draft.condition(ConditionType.REPLICA_FAILURE, True, FAILED_CREATE, message)
    if previous is None or previous.status != "True" or previous.message != message:
        draft.events.append(JobEvent("Warning", FAILED_CREATE, message))
    draft.update(reason=FAILED_CREATE, message=message)
    return draft.finish()
