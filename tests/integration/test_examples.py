"""Every manifest in examples/ is applied and reaches the outcome its comment promises."""

from pathlib import Path

import pytest
import yaml

from integration.trainwave_fixtures import job, wait_for_phase, worker_pods

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

# file -> (phase, reason, restarts) it must reach
OUTCOMES = {
    "single-worker.yaml": ("Succeeded", "Succeeded", 0),
    "distributed-4x8.yaml": ("Succeeded", "Succeeded", 0),
    "rdma-gpudirect-2x8.yaml": ("Succeeded", "Succeeded", 0),
    "shared-gpu-finetune.yaml": ("Succeeded", "Succeeded", 0),
    "restart-then-fail.yaml": ("Failed", "MaxRestartsExceeded", 2),
    "suspended.yaml": ("Suspended", "Suspended", 0),
    "goodput-2x8.yaml": ("Succeeded", "Succeeded", 0),
}


def test_every_example_has_an_expected_outcome():
    assert sorted(p.name for p in EXAMPLES.glob("*.yaml")) == sorted(OUTCOMES)


@pytest.mark.parametrize("example", sorted(OUTCOMES))
def test_example_reaches_its_outcome(cluster, namespace, running_operator, example):
    path = EXAMPLES / example
    name = yaml.safe_load(path.read_text())["metadata"]["name"]
    cluster.kubectl("apply", "-n", namespace, "-f", str(path))
    phase, reason, restarts = OUTCOMES[example]
    body = wait_for_phase(cluster, namespace, name, phase, timeout=150)
    assert (body["status"]["reason"], body["status"]["restarts"]) == (reason, restarts)
    if phase == "Suspended":
        cluster.kubectl("patch", "tj", name, "-n", namespace, "--type=merge",
                        "-p", '{"spec":{"runPolicy":{"suspend":false}}}')  # fmt: skip
        wait_for_phase(cluster, namespace, name, "Succeeded", timeout=90)


def test_the_shared_example_is_pinned_to_a_gpu_by_placement(cluster, namespace, running_operator):
    """Placement's part: the pod's GPU UUID annotation (its env reads it through a fieldRef,
    and its budget: built without a cluster in tests/unit/test_examples_built.py)."""
    path = EXAMPLES / "shared-gpu-finetune.yaml"
    cluster.kubectl("apply", "-n", namespace, "-f", str(path))
    wait_for_phase(cluster, namespace, "shared-gpu-finetune", "Running", timeout=90)
    [pod] = worker_pods(cluster, namespace, "shared-gpu-finetune")
    assert pod["metadata"]["annotations"]["trainwave.io/gpu-uuid"].startswith("GPU-")
    isolation = job(cluster, namespace, "shared-gpu-finetune")["status"]["isolation"]
    assert "the runtime's prepare() holds the job to 6656 MiB" in isolation
