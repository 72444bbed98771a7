"""The local control plane itself: nodes, scheduling, simulated pods, deletion, RBAC."""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from typing import Any

import pytest

from cluster.controlplane import Cluster, cluster_status
from trainwave.contract import (
    GPU_RESOURCE,
    NODE_LABEL_GPU_PRODUCT,
    NODE_LABEL_RACK,
    RDMA_RESOURCE,
    SIM_EXIT_CODE,
    SIM_RESULT,
    SIM_RUN_FOR,
)

pytestmark = pytest.mark.integration


def make_pod(
    name: str,
    *,
    gpus: int = 8,
    result: str | None = None,
    run_for: str | None = None,
    exit_code: int | None = None,
    containers: int = 1,
) -> dict[str, Any]:
    annotations = {SIM_RESULT: result, SIM_RUN_FOR: run_for}
    if exit_code is not None:
        annotations[SIM_EXIT_CODE] = str(exit_code)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "annotations": {k: v for k, v in annotations.items() if v is not None},
        },
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": f"c{index}",
                    "image": "example.invalid/never-pulled",
                    # Extended resources are requested through limits.
                    "resources": {"limits": {GPU_RESOURCE: str(gpus)} if index == 0 else {}},
                }
                for index in range(containers)
            ],
        },
    }


def create(cluster: Cluster, namespace: str, manifest: dict[str, Any]) -> None:
    cluster.kubectl("create", "-n", namespace, "-f", "-", input=json.dumps(manifest))


def get(cluster: Cluster, namespace: str, *what: str) -> Any:
    return json.loads(cluster.kubectl("get", "-n", namespace, "-o", "json", *what).stdout)


def wait_phase(cluster: Cluster, namespace: str, pod: str, phase: str, timeout: int = 30) -> None:
    cluster.kubectl(
        "wait", "-n", namespace, f"pod/{pod}",
        f"--for=jsonpath={{.status.phase}}={phase}", f"--timeout={timeout}s",
        timeout=timeout + 10,
    )  # fmt: skip


def test_cluster_is_healthy_and_reports_status(cluster: Cluster) -> None:
    status = cluster_status(cluster.state_dir)

    assert status.healthy
    assert [c.name for c in status.components] == [
        "etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok",
    ]  # fmt: skip
    assert cluster.kubectl("get", "--raw", "/readyz").stdout.strip() == "ok"


def test_small_topology_nodes_are_ready_with_gpus(cluster: Cluster) -> None:
    nodes = get(cluster, "default", "nodes", "-l", "type=kwok")["items"]

    nodes = [n for n in nodes if "test.trainwave.io/pool" not in n["metadata"]["labels"]]

    assert len(nodes) == 9
    for node in nodes:
        ready = {c["type"]: c["status"] for c in node["status"]["conditions"]}["Ready"]
        assert ready == "True", node["metadata"]["name"]
        assert node["status"]["allocatable"][GPU_RESOURCE] == "8"
        assert node["metadata"]["labels"][NODE_LABEL_GPU_PRODUCT] == "NVIDIA-H100-80GB-HBM3"
        assert not node["spec"].get("taints")
    racks = {n["metadata"]["name"]: n["metadata"]["labels"][NODE_LABEL_RACK] for n in nodes}
    assert sorted(set(racks.values())) == ["rack-00", "rack-01", "rack-02"]
    shared = [n for n in nodes if racks[n["metadata"]["name"]] == "rack-02"]
    assert [n["status"]["allocatable"].get("trainwave.io/gpu-memory") for n in shared] == [
        str(8 * 81559)
    ]
    assert all(RDMA_RESOURCE in n["status"]["allocatable"] for n in nodes if n not in shared)


def test_gpu_pod_is_scheduled_runs_and_succeeds_after_run_for(
    cluster: Cluster, namespace: str
) -> None:
    create(cluster, namespace, make_pod("ok", result="Succeeded", run_for="2s", containers=2))

    wait_phase(cluster, namespace, "ok", "Running")
    wait_phase(cluster, namespace, "ok", "Succeeded")

    pod = get(cluster, namespace, "pod", "ok")
    assert pod["spec"]["nodeName"].startswith("gpu-r")
    assert pod["status"]["podIP"].startswith("10.244.")
    states = [s["state"]["terminated"] for s in pod["status"]["containerStatuses"]]
    assert [(s["exitCode"], s["reason"]) for s in states] == [(0, "Completed")] * 2
    started = datetime.fromisoformat(pod["status"]["startTime"])
    finished = datetime.fromisoformat(states[0]["finishedAt"])
    assert (finished - started).total_seconds() >= 2


def test_failed_pod_reports_its_exit_code(cluster: Cluster, namespace: str) -> None:
    create(cluster, namespace, make_pod("crash", gpus=4, result="Failed", exit_code=3))

    wait_phase(cluster, namespace, "crash", "Failed")

    state = get(cluster, namespace, "pod", "crash")["status"]["containerStatuses"][0]["state"]
    assert state["terminated"]["exitCode"] == 3
    assert state["terminated"]["reason"] == "Error"


def test_pod_without_result_keeps_running_and_deletes_promptly(
    cluster: Cluster, namespace: str
) -> None:
    create(cluster, namespace, make_pod("forever", gpus=1))
    wait_phase(cluster, namespace, "forever", "Running")

    cluster.kubectl("delete", "-n", namespace, "pod/forever", "--timeout=20s", timeout=30)

    assert get(cluster, namespace, "pods")["items"] == []


def test_pod_asking_for_more_gpus_than_a_node_has_stays_pending(
    cluster: Cluster, namespace: str
) -> None:
    create(cluster, namespace, make_pod("too-big", gpus=9))

    cluster.kubectl(
        "wait", "-n", namespace, "pod/too-big", "--for=condition=PodScheduled=False",
        "--timeout=30s",
    )  # fmt: skip

    pod = get(cluster, namespace, "pod", "too-big")
    assert pod["status"]["phase"] == "Pending"
    assert "Insufficient nvidia.com/gpu" in pod["status"]["conditions"][0]["message"]


def test_deleting_a_namespace_removes_its_pods(cluster: Cluster) -> None:
    name = f"t-ns-delete-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", name)
    cluster.kubectl("wait", "--for=create", "serviceaccount/default", "-n", name, "--timeout=30s")
    for index in range(3):
        create(cluster, name, make_pod(f"w{index}", gpus=1))
    for index in range(3):
        wait_phase(cluster, name, f"w{index}", "Running")

    cluster.kubectl("delete", "namespace", name, "--timeout=60s", timeout=70)

    leftover = cluster.kubectl("get", "pods", "-A", "-o", "name", "--field-selector",
                               f"metadata.namespace={name}").stdout  # fmt: skip
    assert leftover.strip() == ""
    assert cluster.kubectl("get", "namespace", name, check=False).returncode != 0


def test_rbac_is_enforced_for_service_accounts(cluster: Cluster, namespace: str) -> None:
    subject = f"system:serviceaccount:{namespace}:default"

    denied = cluster.kubectl("auth", "can-i", "list", "secrets", f"--as={subject}", check=False)
    admin = cluster.kubectl("auth", "can-i", "list", "secrets", check=False)

    assert (denied.returncode, denied.stdout.strip()) == (1, "no")
    assert (admin.returncode, admin.stdout.strip()) == (0, "yes")
