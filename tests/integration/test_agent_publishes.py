"""The node agent against the real control plane, as the chart's agent ServiceAccount.

`trainwave agent` runs as a local process (no container runtime here) on a
fake sysfs tree and a fake GPU file, and publishes to a Node this module
creates for itself. That Node is managed by kwok (annotation) but carries no
`type=kwok` label, so `cluster up` neither counts nor repairs it; a taint
keeps other tests' pods off it, and it has no `nvidia.com/gpu`, so placement
never picks it. The simulated topology nodes are only read.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

import trainwave
from cluster.controlplane import Cluster, tool
from cluster.deploy import service_account_kubeconfig
from cluster.topology import KWOK_NODE_ANNOTATION, KWOK_NODE_VALUE
from integration.agent_pods import AGENT_ACCOUNT, agent_kubeconfig_on, delete_pod
from integration.trainwave_fixtures import wait_until
from trainwave import contract
from trainwave.agent.changes import quantity_value
from trainwave.agent.fake_gpus import fake_gpus_document
from unit.agent_trees import GPU_MEMORY_MIB, make_backend, make_node

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

SOURCE_ROOT = Path(trainwave.__file__).resolve().parents[1]  # this checkout's operator/
FOREIGN = {"team.example.com/pool": "research", "nvidia.com/gpu.family": "hopper"}
TEST_TAINT = {"key": "trainwave.io/agent-test", "effect": "NoSchedule"}
MEMORY = contract.SHARED_GPU_MEMORY_RESOURCE
H100_LABELS = {
    contract.NODE_LABEL_GPU_PRODUCT: "NVIDIA-H100-80GB-HBM3",
    contract.NODE_LABEL_GPU_COUNT: "8",
    contract.NODE_LABEL_GPU_MEMORY: str(GPU_MEMORY_MIB),
    contract.NODE_LABEL_RDMA: "infiniband",
    contract.NODE_LABEL_RDMA_NICS: "8",
}


def node_manifest(name: str) -> dict[str, Any]:
    capacity = {"cpu": "64", "memory": "512Gi", "pods": "110"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {KWOK_NODE_ANNOTATION: KWOK_NODE_VALUE},
            "labels": {"kubernetes.io/hostname": name, **FOREIGN},
        },
        "spec": {"taints": [TEST_TAINT]},
        "status": {"capacity": capacity, "allocatable": dict(capacity)},
    }


def create_node(cluster: Cluster, name: str) -> None:
    cluster.kubectl("create", "-f", "-", input=yaml.safe_dump(node_manifest(name)))


@pytest.fixture(scope="module")
def agent_kubeconfig(
    trainwave_installed: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    path = tmp_path_factory.mktemp("agent") / "kubeconfig"
    return service_account_kubeconfig(trainwave_installed, path, account=AGENT_ACCOUNT)


@pytest.fixture
def node_name(cluster: Cluster) -> Iterator[str]:
    """A fresh name; the Node (if a test created it) is deleted afterwards."""
    name = f"agent-it-{uuid.uuid4().hex[:8]}"
    yield name
    cluster.kubectl("delete", "node", name, "--ignore-not-found", "--wait=false", check=False)


@pytest.fixture
def bound_kubeconfig(
    trainwave_installed: Cluster, node_name: str, tmp_path: Path
) -> Iterator[Path]:
    """The agent's token as the kubelet mounts it: bound to its pod on `node_name`. The
    chart's admission policy (agent-node-policy.yaml) lets only such a token change the Node."""
    path, pod = agent_kubeconfig_on(trainwave_installed, node_name, tmp_path / "bound-kubeconfig")
    yield path
    delete_pod(trainwave_installed, pod)


def agent_argv(node: str, root: Path, gpus: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "trainwave.cli", "agent", "--node-name", node,
        "--root", str(root), "--fake-gpus", str(gpus), *extra,
    ]  # fmt: skip


def agent_env(kubeconfig: Path) -> dict[str, str]:
    # This checkout's code, whatever the virtualenv's editable install points at.
    return os.environ | {"KUBECONFIG": str(kubeconfig), "PYTHONPATH": str(SOURCE_ROOT)}


def run_agent(
    kubeconfig: Path, node: str, root: Path, gpus: Path, *extra: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        agent_argv(node, root, gpus, "--once", *extra),
        env=agent_env(kubeconfig),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def write_inputs(directory: Path, *, nics: int = 8) -> tuple[Path, Path]:
    """A fake HGX root (8 H100s, `nics` InfiniBand NICs) and the matching GPU file."""
    root = make_node(directory / "root", nics=nics)
    gpus = directory / "gpus.json"
    gpus.write_text(json.dumps(fake_gpus_document(make_backend(8, switched=[range(8)]))))
    return root, gpus


def get_node(cluster: Cluster, name: str) -> dict[str, Any]:
    node: dict[str, Any] = json.loads(cluster.kubectl("get", "node", name, "-o", "json").stdout)
    return node


def shared_memory(node: dict[str, Any]) -> tuple[int | None, int | None]:
    status = node["status"]
    return tuple(  # type: ignore[return-value]
        quantity_value(status[side][MEMORY]) if MEMORY in status[side] else None
        for side in ("capacity", "allocatable")
    )


def agent_fields(node: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        entry
        for entry in node["metadata"].get("managedFields", [])
        if entry["manager"] == contract.AGENT_FIELD_MANAGER
    ]


def test_agent_publishes_then_updates_its_node(
    cluster: Cluster, bound_kubeconfig: Path, node_name: str, tmp_path: Path
) -> None:
    create_node(cluster, node_name)
    root, gpus = write_inputs(tmp_path / "first")

    first = run_agent(bound_kubeconfig, node_name, root, gpus, "--shared-gpus", "0,1")

    assert first.returncode == 0, first.stderr
    assert "change=label-added key=nvidia.com/gpu.count new='8'" in first.stderr
    node = get_node(cluster, node_name)
    labels = node["metadata"]["labels"]
    assert labels.items() >= (H100_LABELS | FOREIGN).items()
    assert labels[contract.NODE_LABEL_NVLINK_DOMAIN] == node_name
    inventory = json.loads(node["metadata"]["annotations"][contract.ANNOTATION_INVENTORY])
    uuids = [gpu["uuid"] for gpu in inventory["gpus"]]
    assert inventory["sharedGpus"] == [
        {"index": i, "uuid": uuids[i], "memoryMiB": GPU_MEMORY_MIB} for i in (0, 1)
    ]
    assert inventory["nvlinkIslands"] == [list(range(8))]
    assert shared_memory(node) == (2 * GPU_MEMORY_MIB, 2 * GPU_MEMORY_MIB)

    # The same inputs again: nothing to send, so the agent's managed fields keep
    # their timestamps (second resolution, hence the pause).
    time.sleep(1.1)
    again = run_agent(bound_kubeconfig, node_name, root, gpus, "--shared-gpus", "0,1")
    assert again.returncode == 0, again.stderr
    assert "change=" not in again.stderr
    assert agent_fields(get_node(cluster, node_name)) == agent_fields(node)

    # The NICs are gone and sharing is off: the RDMA labels and the resource go,
    # the GPU labels and everybody else's labels stay.
    root, gpus = write_inputs(tmp_path / "second", nics=0)
    second = run_agent(bound_kubeconfig, node_name, root, gpus, "--shared-gpus", "none")

    assert second.returncode == 0, second.stderr
    node = get_node(cluster, node_name)
    labels = node["metadata"]["labels"]
    assert contract.NODE_LABEL_RDMA not in labels
    assert contract.NODE_LABEL_RDMA_NICS not in labels
    assert labels[contract.NODE_LABEL_GPU_COUNT] == "8"
    assert labels.items() >= FOREIGN.items()
    assert shared_memory(node) == (None, None)
    inventory = json.loads(node["metadata"]["annotations"][contract.ANNOTATION_INVENTORY])
    assert inventory["sharedGpus"] == []
    assert node["spec"]["taints"] == [TEST_TAINT]


def test_agent_labels_have_the_keys_of_the_simulated_nodes(
    cluster: Cluster, bound_kubeconfig: Path, node_name: str, tmp_path: Path
) -> None:
    """Placement reads the same label keys from a real H100 node as from its kwok twin."""
    create_node(cluster, node_name)
    root, gpus = write_inputs(tmp_path)
    assert run_agent(bound_kubeconfig, node_name, root, gpus).returncode == 0

    node = get_node(cluster, node_name)
    published = set(node["metadata"]["annotations"][contract.ANNOTATION_AGENT_LABELS].split(","))
    simulated = get_node(cluster, "gpu-r00-n00")["metadata"]["labels"]
    # Spine and rack describe the network fabric, which no node can see from the
    # inside: cluster admins (or the topology file) set them, not the agent.
    fabric = {contract.NODE_LABEL_SPINE, contract.NODE_LABEL_RACK}
    twin = {
        key
        for key in simulated
        if key.startswith(("trainwave.io/", "nvidia.com/")) and key not in fabric
    }
    assert published == twin


@pytest.mark.parametrize(
    ("verb", "resource", "allowed"),
    [
        ("get", "nodes", "yes"),
        ("patch", "nodes", "yes"),
        ("patch", "nodes --subresource=status", "yes"),
        ("list", "nodes", "no"),
        ("update", "nodes", "no"),
        ("delete", "nodes", "no"),
        ("create", "nodes", "no"),
        ("patch", "pods -A", "no"),
        ("get", "secrets -A", "no"),
        ("patch", "configmaps -n kube-system", "no"),
        ("patch", "trainingjobs.trainwave.io -A", "no"),
        ("get", "nodes --subresource=proxy", "no"),
    ],
    ids=lambda value: str(value).replace(" ", ""),
)
def test_agent_account_may_only_touch_nodes(
    agent_kubeconfig: Path, verb: str, resource: str, allowed: str
) -> None:
    result = subprocess.run(
        [str(tool("kubectl")), "auth", "can-i", verb, *resource.split()],
        env=os.environ | {"KUBECONFIG": str(agent_kubeconfig)},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.stdout.strip() == allowed, result.stderr


def test_missing_node_is_reported(agent_kubeconfig: Path, node_name: str, tmp_path: Path) -> None:
    root, gpus = write_inputs(tmp_path)
    result = run_agent(agent_kubeconfig, node_name, root, gpus)

    assert result.returncode == 1
    assert f"get nodes/{node_name}: node not found; --node-name" in result.stderr


def test_forbidden_is_reported_with_the_rules_needed(
    cluster: Cluster, namespace: str, node_name: str, tmp_path: Path
) -> None:
    cluster.kubectl("create", "serviceaccount", "nobody", "-n", namespace)
    kubeconfig = service_account_kubeconfig(
        cluster, tmp_path / "kubeconfig", account="nobody", namespace=namespace
    )
    create_node(cluster, node_name)
    root, gpus = write_inputs(tmp_path)
    result = run_agent(kubeconfig, node_name, root, gpus)

    assert result.returncode == 1
    assert f"get nodes/{node_name}: forbidden: the agent's ServiceAccount needs" in result.stderr


def test_agent_loop_survives_errors_and_recovers(
    cluster: Cluster, bound_kubeconfig: Path, node_name: str, tmp_path: Path
) -> None:
    """No node yet: the agent logs, waits an interval and retries; once the node exists, it
    publishes, without a restart."""
    root, gpus = write_inputs(tmp_path)
    log = tmp_path / "agent.log"
    with log.open("w") as sink:
        process = subprocess.Popen(
            agent_argv(node_name, root, gpus, "--interval", "1"),
            env=agent_env(bound_kubeconfig),
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_until(lambda: log.read_text().count("node not found") >= 2, 30, "two failed passes")
        assert process.poll() is None, log.read_text()
        create_node(cluster, node_name)

        def published() -> bool:
            labels = get_node(cluster, node_name)["metadata"]["labels"]
            return labels.get(contract.NODE_LABEL_GPU_COUNT) == "8"

        wait_until(published, 30, "the agent to publish once the node exists")
    finally:
        process.terminate()  # SIGTERM: the agent finishes its pass and exits 0
        returncode = process.wait(timeout=30)
    assert returncode == 0, log.read_text()
