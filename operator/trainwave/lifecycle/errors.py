"""When a reconcile fails in a way nobody planned for: say so on the job. Pure.

Every error we expect has its own decision (InvalidSpec, FailedCreate, a
conflict retried at once). This is the net under them: an operator bug or an
API answer we did not foresee. The job is not failed (the fault may be ours,
and a fixed operator picks the job up again); a `ReconcileError` condition,
`status.reason`/`message` and one Warning Event per new message say what broke,
and the work queue retries with backoff. The reconciler clears the condition
after the next reconcile that succeeds.
"""

from datetime import datetime

from trainwave.api.reasons import Reason
from trainwave.api.status import ConditionType, TrainingJobStatus
from trainwave.api.trainingjob import ObjectMeta
from trainwave.lifecycle.draft import Decision, Draft, JobEvent

RECONCILE_ERROR = Reason.RECONCILE_ERROR
RECONCILED = Reason.RECONCILED
_MAX_MESSAGE = 512


def reconcile_failed(
    meta: ObjectMeta, status: TrainingJobStatus, error: str, now: datetime
) -> Decision:
    """`error` is what went wrong, e.g. "KeyError: 'containers'"."""
    draft = Draft(meta=meta, now=now, status=status)
    message = f"reconcile failed, retrying with backoff: {error}"[:_MAX_MESSAGE]
    previous = status.condition(ConditionType.RECONCILE_ERROR)
    draft.condition(ConditionType.RECONCILE_ERROR, True, RECONCILE_ERROR, message)
    if previous is None or previous.status != "True" or previous.message != message:
        draft.events.append(JobEvent("Warning", RECONCILE_ERROR, message))
    draft.update(reason=RECONCILE_ERROR, message=message)
    return draft.finish()


def reconciled(meta: ObjectMeta, status: TrainingJobStatus, now: datetime) -> Decision | None:
    """The condition turned False once a reconcile went through; None if there is none."""
    previous = status.condition(ConditionType.RECONCILE_ERROR)
    if previous is None or previous.status != "True":
        return None
    draft = Draft(meta=meta, now=now, status=status)
    draft.clear(ConditionType.RECONCILE_ERROR, RECONCILED, "reconciled after the error")
    draft.events.append(JobEvent("Normal", RECONCILED, "reconciled after the error"))
    return draft.finish()
