"""count_created folds the workers a decision just created into it, and gives what deciding
again with them would give: the reconciler's create path decides once (issue 25).

Each case is a decision that only creates workers of the attempt its status records
(lifecycle/plan.py only_creates); the created pods are built and observed as the
reconciler does (behind the gate, or placed at creation as placer.place_now returns
them). The reference is decide() run again from the decided status with those pods,
which is what the reconciler did before.
"""

from __future__ import annotations

from typing import Any

import pytest
from factories import NOW, make_job, make_pod
from test_kueue_admission import ADMITTED, admission

from trainwave import contract
from trainwave.builders.gating import build_release_patch, merged
from trainwave.builders.pods import build_worker_pods
from trainwave.lifecycle.admission import Admission
from trainwave.lifecycle.decide import Decision, count_created, decide
from trainwave.lifecycle.observed import WorkerPod, observe_pod
from trainwave.lifecycle.plan import only_creates
from trainwave.resolving import resolve_job

pytestmark = pytest.mark.timeout(10)


def placed(pod: dict[str, Any]) -> dict[str, Any]:
    notes = {contract.ANNOTATION_RELEASED_AT: "2026-01-01T12:00:00Z"}
    return merged(pod, build_release_patch(pod, "node-a", notes))


# The worker container asks for 8 GPUs where the spec gives it 1: a warning that lasts.
OVERRIDING = {
    "spec": {"containers": [{"name": "worker", "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}
}

CASES = [
    pytest.param({}, [], False, None, id="new-job-gated"),
    pytest.param({}, [], True, None, id="new-job-placed-at-creation"),
    pytest.param({"gpus_per_worker": 8, "workers": 3}, [], False, None, id="new-gpu-gang"),
    pytest.param(
        {"phase": "Pending", "workers": 3},
        [make_pod(0, phase="Pending", bound=False, gated=True)],
        False,
        None,
        id="rest-of-a-partial-gang",
    ),
    pytest.param(
        {"phase": "Restarting", "attempt": 1, "restarts": 1},
        [make_pod(0, exit_code=1, phase="Failed"), make_pod(1, exit_code=0, phase="Failed")],
        False,
        None,
        id="restarted-gang-of-a-written-attempt",
    ),
    pytest.param({}, [], False, admission(*ADMITTED), id="admitted-by-kueue"),
    pytest.param(
        {"template": OVERRIDING, "gpus_per_worker": 1}, [], True, None, id="resources-overridden"
    ),
]


def created(decision: Decision, resolved: Any, at_creation: bool) -> list[WorkerPod]:
    pods = build_worker_pods(resolved, decision.create_ranks, decision.status.attempt)
    observed = (observe_pod(placed(p) if at_creation else p) for p in pods)
    return [worker for worker in observed if worker is not None]


@pytest.mark.parametrize(("job", "pods", "at_creation", "queued"), CASES)
def test_counting_the_created_workers_is_deciding_again_with_them(
    job: dict[str, Any], pods: list[WorkerPod], at_creation: bool, queued: Admission | None
) -> None:
    written = make_job(**job)
    first = decide(resolve_job(written), pods, NOW, admission=queued)
    assert only_creates(first, written.status), "the case must be the create path"
    decided = resolve_job(written.model_copy(update={"status": first.status}))
    after = pods + created(first, decided, at_creation)

    counted = count_created(decided, first, after, NOW)
    again = decide(decided, after, NOW, admission=queued, memory=first.memory)

    assert counted.status == again.status
    assert counted.events == again.events
    assert counted.create_ranks == again.create_ranks == ()
    assert counted.delete_pods == again.delete_pods
    assert counted.wants_placement == again.wants_placement
    assert counted.wants_service == again.wants_service
    assert counted.workload == again.workload
    assert counted.requeue_after == again.requeue_after
    assert counted.all_running_after == again.all_running_after
