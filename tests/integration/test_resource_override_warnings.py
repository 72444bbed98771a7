"""A GPU limit in the template that differs from gpusPerWorker: the job runs with
gpusPerWorker's value, and the user is told where they look (issue 28 item 2)."""

from __future__ import annotations

import pytest

from integration.trainwave_fixtures import (
    apply,
    condition,
    events_about,
    job,
    job_manifest,
    wait_for_phase,
    worker_pods,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

FIELD = "spec.template.spec.containers[worker].resources.limits[nvidia.com/gpu]"


def test_a_replaced_gpu_limit_gets_a_warning_and_a_condition(
    cluster, namespace, running_operator
) -> None:
    template = {
        "containers": [{"name": "worker", "resources": {"limits": {"nvidia.com/gpu": "8"}}}]
    }
    apply(cluster, namespace, job_manifest("ported", gpus=1, run_for="30s", template_spec=template))
    wait_for_phase(cluster, namespace, "ported", "Running", timeout=90)

    expected = f"{FIELD} is 8, but each worker gets 1 (set by trainwave from spec.gpusPerWorker)"
    found = condition(job(cluster, namespace, "ported"), "ResourcesOverridden")
    assert found is not None
    assert (found["status"], found["reason"], found["message"]) == (
        "True", "ResourcesOverridden", expected,
    )  # fmt: skip
    warnings = events_about(
        cluster, namespace,
        lambda e: e["regarding"]["name"] == "ported" and e.get("reason") == "ResourcesOverridden",
        "the ResourcesOverridden Warning",
    )  # fmt: skip
    assert [(e["type"], e["note"]) for e in warnings] == [("Warning", expected)]
    # What the worker really asked for: gpusPerWorker's 1.
    pods = worker_pods(cluster, namespace, "ported")
    assert pods
    for pod in pods:
        worker = next(c for c in pod["spec"]["containers"] if c["name"] == "worker")
        assert worker["resources"]["limits"]["nvidia.com/gpu"] == "1"
