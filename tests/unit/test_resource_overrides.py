"""A worker-container resource trainwave sets itself, written by the user with another value:
found purely (resolving.template_overrides), replaced in the pod, and reported once as a
ResourcesOverridden condition and a Warning Event naming the field, the value written and
the value each worker gets."""

from __future__ import annotations

from typing import Any

import pytest
from factories import NOW, make_job

from trainwave import contract
from trainwave.api.status import ConditionType
from trainwave.builders.pods import build_worker_pods
from trainwave.lifecycle.decide import decide
from trainwave.resolving import resolve_job

pytestmark = pytest.mark.timeout(10)

WORKER = f"spec.template.spec.containers[{contract.WORKER_CONTAINER}].resources"


def template(resources: dict[str, Any], name: str = contract.WORKER_CONTAINER) -> dict[str, Any]:
    return {"spec": {"containers": [{"name": name, "resources": resources}]}}


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        pytest.param(
            {"gpus_per_worker": 1, "template": template({"limits": {"nvidia.com/gpu": "8"}})},
            [(f"{WORKER}.limits[nvidia.com/gpu]", "8", "1", "spec.gpusPerWorker")],
            id="gpu-limit-8-gets-1",
        ),
        pytest.param(
            {"gpus_per_worker": 2,
             "template": template({"requests": {"nvidia.com/gpu": 4},
                                   "limits": {"nvidia.com/gpu": 4}})},
            [(f"{WORKER}.limits[nvidia.com/gpu]", "4", "2", "spec.gpusPerWorker"),
             (f"{WORKER}.requests[nvidia.com/gpu]", "4", "2", "spec.gpusPerWorker")],
            id="gpu-request-and-limit",
        ),
        pytest.param(
            {"gpus_per_worker": 1, "resources": {"limits": {"nvidia.com/gpu": "2"}}},
            [("spec.resources.limits[nvidia.com/gpu]", "2", "1", "spec.gpusPerWorker")],
            id="job-level-resources",
        ),
        pytest.param(
            {"gpus_per_worker": 8, "template": template({"limits": {"nvidia.com/gpu": "8"}})},
            [],
            id="same-value-ported-from-pytorchjob-is-no-news",
        ),
        pytest.param(
            {"gpus_per_worker": 1,
             "template": template({"limits": {"nvidia.com/gpu": "8"}}, name="sidecar")},
            [],
            id="another-container-is-left-alone",
        ),
        pytest.param(
            {"gpus_per_worker": 0, "template": template({"limits": {"cpu": "4", "memory": "8Gi"}})},
            [],
            id="resources-trainwave-does-not-set",
        ),
        pytest.param(
            {"gpuSharing": {"memory": "1Gi"},
             "template": template({"limits": {contract.SHARED_GPU_MEMORY_RESOURCE: "20000"}})},
            [(f"{WORKER}.limits[{contract.SHARED_GPU_MEMORY_RESOURCE}]", "20000", "1024",
              "spec.gpuSharing (MiB)")],
            id="shared-gpu-memory",
        ),
        pytest.param(
            {"gpus_per_worker": 1, "network": {"rdma": {"count": 1}},
             "template": template({"limits": {contract.RDMA_RESOURCE: "4"}})},
            [(f"{WORKER}.limits[{contract.RDMA_RESOURCE}]", "4", "1",
              "spec.network.rdma.count")],
            id="rdma-devices",
        ),
    ],
)  # fmt: skip
def test_overrides_are_found_where_the_user_wrote_them(
    options: dict[str, Any], expected: list[tuple[str, str, str, str]]
) -> None:
    resolved = resolve_job(make_job(**options))
    found = [(o.field, o.written, o.applied, o.source) for o in resolved.overrides]
    assert found == expected


def test_the_worker_gets_trainwaves_value_and_a_request_that_agrees() -> None:
    resources = {"requests": {"nvidia.com/gpu": "8"}, "limits": {"nvidia.com/gpu": "8"}}
    job = make_job(gpus_per_worker=1, template=template(resources))
    [pod] = build_worker_pods(resolve_job(job), (0,), attempt=0)
    worker = next(c for c in pod["spec"]["containers"] if c["name"] == contract.WORKER_CONTAINER)
    # A request different from the limit would make the API server refuse the pod.
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert worker["resources"]["requests"]["nvidia.com/gpu"] == 1


def test_a_warning_event_and_a_condition_name_field_written_and_applied() -> None:
    job = make_job(gpus_per_worker=1, template=template({"limits": {"nvidia.com/gpu": "8"}}))
    first = decide(resolve_job(job), [], NOW)
    condition = first.status.condition(ConditionType.RESOURCES_OVERRIDDEN)
    assert condition is not None
    assert (condition.status, condition.reason) == ("True", "ResourcesOverridden")
    expected = (
        f"{WORKER}.limits[nvidia.com/gpu] is 8, but each worker gets 1 "
        "(set by trainwave from spec.gpusPerWorker)"
    )
    assert condition.message == expected
    warnings = [e for e in first.events if e.type == "Warning"]
    assert [(e.reason, e.message) for e in warnings] == [("ResourcesOverridden", expected)]
    # Decided again with that status (a resync): no second Event.
    again = decide(resolve_job(make_job(gpus_per_worker=1,
                            template=template({"limits": {"nvidia.com/gpu": "8"}}),
                            status_extra=first.status.model_dump(by_alias=True, mode="json"))),
                   [], NOW)  # fmt: skip
    assert not [e for e in again.events if e.reason == "ResourcesOverridden"]
    assert again.status.condition(ConditionType.RESOURCES_OVERRIDDEN) == condition


def test_no_override_no_condition() -> None:
    decision = decide(resolve_job(make_job(gpus_per_worker=1)), [], NOW)
    assert decision.status.condition(ConditionType.RESOURCES_OVERRIDDEN) is None
    assert not [e for e in decision.events if e.type == "Warning"]
