"""The placement part of a job's life: waiting behind the gate, placed, or not bound in time.

Pure. The placer (controller/placer.py) answers for gangs behind the gate; its
latest word arrives here as a `PlacementWait`. Codes in `REFUSALS` mean the
gang can never start as asked, so the job fails instead of waiting forever.
"""

from trainwave.api.reasons import Reason
from trainwave.api.status import ConditionType, Phase, PlacementStatus
from trainwave.api.trainingjob import TrainingJob
from trainwave.lifecycle.draft import Draft, PlacementWait, fail
from trainwave.lifecycle.observed import WorkerPod
from trainwave.placement.sharing import LARGER_THAN_ANY_GPU

# The placer's codes for gangs that can never start as asked: the job fails
# with this reason rather than wait forever.
INVALID_PLACEMENT = Reason.INVALID_REQUEST  # e.g. an unknown topology level
RDMA_UNAVAILABLE = Reason.RDMA_UNAVAILABLE  # no node can provide the RDMA asked for
REFUSALS: dict[str, tuple[str, str]] = {
    INVALID_PLACEMENT: (Reason.INVALID_SPEC, "spec.placement"),
    RDMA_UNAVAILABLE: (RDMA_UNAVAILABLE, "spec.network.rdma"),
    LARGER_THAN_ANY_GPU: (LARGER_THAN_ANY_GPU, "spec.gpuSharing"),
}


def await_placement(
    draft: Draft, job: TrainingJob, existing: list[WorkerPod], waiting: PlacementWait | None
) -> None:
    """The gang exists behind the gate; the placer decides when and where it starts."""
    if waiting is not None and waiting.code in REFUSALS:
        reason, field = REFUSALS[waiting.code]
        draft.stop(existing)
        fail(draft, reason, f"{field}: {waiting.reason}")
        return
    draft.wants_placement = True
    draft.update(placement=None)
    if waiting is None:
        spec = job.spec
        reason = str(Reason.PLACING)
        message = f"finding room for {spec.workers} worker(s) x {spec.gpus_per_worker} GPU(s)"
    else:
        reason, message = waiting.code, waiting.reason
    draft.condition(ConditionType.SCHEDULED, False, reason, message)
    draft.enter(Phase.SCHEDULING, reason, message)


def record_placement(draft: Draft, existing: list[WorkerPod]) -> None:
    ranks = sorted(existing, key=lambda p: p.rank)
    if not any(p.placed_node for p in ranks):
        return
    summary = next((p.placement_summary for p in ranks if p.placement_summary), "")
    nodes = [p.placed_node for p in ranks]
    if draft.status.placement is None or draft.status.placement.nodes != nodes:
        draft.update(placement=PlacementStatus(nodes=nodes, summary=summary))


def bind_timed_out(draft: Draft, job: TrainingJob, existing: list[WorkerPod]) -> bool:
    """Re-plan a placed gang whose pods did not bind in time: someone else took the room.

    A released pod's node can no longer change, so re-planning means a new
    attempt with new pods. It is not a counted restart: nothing ran.
    """
    released = [p.released_at for p in existing if not p.bound and p.released_at is not None]
    if not released:
        return False
    timeout = job.spec.placement.bind_timeout_seconds
    waited = (draft.now - min(released)).total_seconds()
    if waited < timeout:
        draft.requeue(timeout - waited)
        return False
    unbound = sorted(p.rank for p in existing if not p.bound)
    message = (
        f"worker(s) {', '.join(map(str, unbound[:5]))} not bound {timeout}s after placement "
        "(bindTimeoutSeconds); the room was taken: re-planning the gang"
    )
    draft.stop(existing)
    draft.update(attempt=draft.status.attempt + 1, attempt_start_time=None, all_running_time=None)
    draft.condition(ConditionType.SCHEDULED, False, Reason.BIND_TIMEOUT, message)
    draft.update(placement=None)
    # Pending, not Scheduling: the new attempt has no pods yet, and in
    # Scheduling missing pods would count as lost workers.
    draft.enter(Phase.PENDING, Reason.BIND_TIMEOUT, message, warning=True)
    return True
