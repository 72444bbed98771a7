"""Shared GPUs on the real control plane: per-GPU pinning, budgets that add up, refusals."""

from __future__ import annotations

import json

import pytest

from integration.node_pools import H100, blocker_pod, node_pool
from integration.trainwave_fixtures import (
    apply,
    condition,
    get_json,
    job,
    job_manifest,
    wait_for_phase,
    wait_until,
    worker_pods,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

SHARED_NODE = {"cpu": "192", "gpu": {**H100, "count": 2, "shared": True}}
MIB = 30 * 1024  # 30Gi: two fit on one 80GB GPU, three do not


def shared_job(name, pool, memory="30Gi"):
    manifest = job_manifest(
        name, workers=1, gpus=0, run_for="120s", template_spec={"nodeSelector": pool.selector}
    )
    manifest["spec"]["gpuSharing"] = {"memory": memory}
    return manifest


def test_shared_jobs_are_pinned_to_gpus_whose_budgets_add_up(cluster, namespace, running_operator):
    with node_pool(cluster, rack_sizes=(1,), shape=SHARED_NODE) as pool:
        [node_name] = pool.nodes
        node = json.loads(cluster.kubectl("get", "node", node_name, "-o", "json").stdout)
        inventory = json.loads(node["metadata"]["annotations"]["trainwave.io/inventory"])
        sizes = {g["uuid"]: g["memoryMiB"] for g in inventory["sharedGpus"]}
        assert node["status"]["allocatable"]["trainwave.io/gpu-memory"] == str(sum(sizes.values()))

        names = [f"share-{i}" for i in range(4)]
        apply(cluster, namespace, *(shared_job(n, pool) for n in names))
        for name in names:
            wait_for_phase(cluster, namespace, name, "Running", timeout=60)
        budgets: dict[str, int] = {}
        for name in names:
            [pod] = worker_pods(cluster, namespace, name)
            uuid = pod["metadata"]["annotations"]["trainwave.io/gpu-uuid"]
            assert uuid in sizes
            assert pod["spec"]["nodeName"] == node_name
            env = json.loads(pod["metadata"]["annotations"]["trainwave.io/worker-env"])
            assert env == {"CUDA_VISIBLE_DEVICES": uuid}
            worker = next(c for c in pod["spec"]["containers"] if c["name"] == "worker")
            # Pinned in the pod itself (no runtime here): the kubelet resolves these
            # from the annotation above when it starts the container.
            pinned = {
                e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"]
                for e in worker["env"]
                if "valueFrom" in e
            }
            for variable in ("NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"):
                assert pinned[variable] == "metadata.annotations['trainwave.io/gpu-uuid']"
            assert worker["resources"]["limits"] == {"trainwave.io/gpu-memory": str(MIB)}
            budgets[uuid] = budgets.get(uuid, 0) + MIB
        assert sorted(budgets.values()) == [2 * MIB, 2 * MIB], "two per GPU, both GPUs used"
        assert all(budgets[u] <= sizes[u] for u in budgets)
        status = job(cluster, namespace, names[0])["status"]
        assert status["isolation"].startswith("soft; GPU: pinned by env")
        assert "not enforced: enable spec.runtime" in status["isolation"]
        assert "no arbiter between" in status["isolation"]

        # A fifth would fit the node's total (kube-scheduler's view) but no single GPU.
        apply(cluster, namespace, shared_job("fifth", pool))
        why = wait_until(
            lambda: (c := condition(job(cluster, namespace, "fifth"), "Scheduled"))
            and c["reason"] == "NotEnoughGPUMemory" and c,
            30, "fifth to wait for GPU memory",
        )  # fmt: skip
        assert "needs 30720 MiB on one GPU per worker" in why["message"]
        assert f"on node {node_name})" in why["message"], "the reason names the GPU"
        assert any(f"(GPU {u} on node" in why["message"] for u in sizes)
        [pod] = worker_pods(cluster, namespace, "fifth")
        assert pod["spec"]["schedulingGates"], "it waits behind the gate"


def test_a_shared_job_leaves_a_gpu_whose_node_it_would_drain_of_cpu(
    cluster, namespace, running_operator
):
    """The packer scores the worker with its pod's CPU request: on the node already running a
    shared worker, this one would leave 1 CPU, stranding the GPU's remaining memory for workers
    like these (they ask 1 and 2 CPUs), so it opens a GPU on the other node. Scored without
    CPU, as before, it joined the started GPU (consolidation)."""
    with node_pool(cluster, rack_sizes=(2,), shape=SHARED_NODE) as pool:
        first = shared_job("first", pool)
        first["spec"]["resources"] = {"requests": {"cpu": "1"}}
        apply(cluster, namespace, first)
        wait_for_phase(cluster, namespace, "first", "Running", timeout=60)
        [pod] = worker_pods(cluster, namespace, "first")
        started = pod["spec"]["nodeName"]
        [other] = [n for n in pool.nodes if n != started]
        # 192 CPUs: the first worker holds 1, this pod 188, so 3 are left on `started`.
        apply(cluster, namespace, blocker_pod("hog", started, 0, {"cpu": "188"}))
        wait_until(
            lambda: get_json(cluster, namespace, "pod", "hog")["status"].get("phase") == "Running",
            30, "the CPU hog to run",
        )  # fmt: skip
        second = shared_job("second", pool)
        second["spec"]["resources"] = {"requests": {"cpu": "2"}}
        apply(cluster, namespace, second)
        wait_for_phase(cluster, namespace, "second", "Running", timeout=60)
        [pod] = worker_pods(cluster, namespace, "second")
        assert pod["spec"]["nodeName"] == other


def test_kube_scheduler_refuses_to_over_commit_shared_gpu_memory(cluster, namespace):
    with node_pool(cluster, rack_sizes=(1,), shape=SHARED_NODE) as pool:
        too_much = 2 * H100["memoryMiB"] + 1
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "greedy"},
            "spec": {
                "nodeSelector": pool.selector,
                "containers": [{"name": "c", "image": "busybox",
                                "resources": {"limits": {"trainwave.io/gpu-memory": too_much}}}],
            },
        }  # fmt: skip
        apply(cluster, namespace, pod)

        def refused():
            found = get_json(cluster, namespace, "pod", "greedy")
            scheduled = next(
                (c for c in found["status"].get("conditions", []) if c["type"] == "PodScheduled"),
                None,
            )
            return scheduled if scheduled and scheduled["status"] == "False" else None

        scheduled = wait_until(refused, 30, "kube-scheduler to refuse the pod")
        assert "Insufficient trainwave.io/gpu-memory" in scheduled["message"]


def test_a_model_larger_than_any_shared_gpu_fails_with_the_estimate(
    cluster, namespace, running_operator
):
    with node_pool(cluster, rack_sizes=(1,), shape=SHARED_NODE) as pool:
        manifest = shared_job("llama", pool)
        manifest["spec"]["gpuSharing"] = {"model": {"preset": "llama-7b", "sequence": 2048}}
        apply(cluster, namespace, manifest)
        body = wait_for_phase(cluster, namespace, "llama", "Failed", timeout=30)
        assert body["status"]["reason"] == "LargerThanAnyGPU"
        message = body["status"]["message"]
        assert message.startswith("spec.gpuSharing: asks ")
        assert "the largest shared GPU has 81559 MiB" in message
        assert "estimated from spec.gpuSharing.model (weights " in message


def test_isolation_of_a_budgeted_job_says_what_the_runtime_enforces(
    cluster, namespace, running_operator
):
    with node_pool(cluster, rack_sizes=(1,), shape=SHARED_NODE) as pool:
        manifest = shared_job("held", pool)
        manifest["spec"]["command"] = ["python", "train.py"]
        manifest["spec"]["runtime"] = {}  # features.submodel defaults to auto
        apply(cluster, namespace, manifest)
        text = wait_until(
            lambda: job(cluster, namespace, "held").get("status", {}).get("isolation"),
            30, "status.isolation of a budgeted job",
        )  # fmt: skip
        assert "the runtime's prepare() holds the job to 30720 MiB" in text
        assert "when the model's measured peak exceeds it" in text
        # This operator runs without --arbiter-dir: no arbiter is claimed, none mounted.
        assert "no arbiter between" in text
        # Status is written before the pods are created: wait for the worker too.
        [pod] = wait_until(lambda: worker_pods(cluster, namespace, "held"), 30, "the worker pod")
        worker = next(c for c in pod["spec"]["containers"] if c["name"] == "worker")
        assert "TRAINWAVE_ARBITER_SOCKET" not in {e["name"] for e in worker["env"]}
        env = {e["name"]: e.get("value") for e in worker["env"]}
        assert env["TRAINWAVE_FEATURE_SUBMODEL"] == "auto"
