"""The agent's ServiceAccount may change only the Node its pod runs on.

RBAC grants it patch on every Node; the chart's ValidatingAdmissionPolicy
(agent-node-policy.yaml) compares the Node with the node name the API server puts
in a pod-bound token's user extra (`authentication.kubernetes.io/node-name`).
Tokens here are minted with the TokenRequest API bound to pods on two nodes,
exactly as the kubelet mints the agent's own.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from cluster.controlplane import Cluster, tool
from cluster.deploy import service_account_kubeconfig
from cluster.topology import KWOK_NODE_ANNOTATION, KWOK_NODE_VALUE
from integration.agent_pods import AGENT_ACCOUNT, agent_kubeconfig_on, delete_pod

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

LABEL = "trainwave.io/own-node-test"


@pytest.fixture
def two_nodes(trainwave_installed: Cluster) -> Iterator[tuple[str, str]]:
    """Two kwok-managed Nodes outside the simulated topology, tainted so no job lands there."""
    names = tuple(f"own-node-{side}-{uuid.uuid4().hex[:6]}" for side in "ab")
    for name in names:
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "annotations": {KWOK_NODE_ANNOTATION: KWOK_NODE_VALUE}},
            "spec": {"taints": [{"key": LABEL, "effect": "NoSchedule"}]},
        }
        trainwave_installed.kubectl("create", "-f", "-", input=yaml.safe_dump(node))
    yield names[0], names[1]
    for name in names:
        trainwave_installed.kubectl("delete", "node", name, "--wait=false", check=False)


def kubectl_as(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(tool("kubectl")), *args],
        env=os.environ | {"KUBECONFIG": str(kubeconfig)},
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip


def label(kubeconfig: Path, node: str, value: str) -> subprocess.CompletedProcess[str]:
    return kubectl_as(kubeconfig, "label", "node", node, f"{LABEL}={value}", "--overwrite")


def patch_status(kubeconfig: Path, node: str) -> str:
    """Merge-patch the Node's status as the agent does (kubectl would GET nodes/status first,
    which the agent's role does not allow); "" when allowed, else the API server's message."""
    api = client.CoreV1Api(config.new_client_from_config(config_file=str(kubeconfig)))
    capacity = {"status": {"capacity": {"example.com/own-node-test": "1"}}}
    try:
        api.patch_node_status(node, capacity)
    except ApiException as error:
        return str(error.body)
    return ""


def test_a_token_bound_to_a_pod_on_one_node_changes_that_node_only(
    trainwave_installed: Cluster, two_nodes: tuple[str, str], tmp_path: Path
) -> None:
    cluster = trainwave_installed
    node_a, node_b = two_nodes
    on_a, pod_a = agent_kubeconfig_on(cluster, node_a, tmp_path / "a")
    on_b, pod_b = agent_kubeconfig_on(cluster, node_b, tmp_path / "b")
    try:
        assert label(on_a, node_a, "a").returncode == 0, "its own node: allowed"
        assert patch_status(on_a, node_a) == "", "its own node's status: allowed"

        refused = label(on_a, node_b, "a")
        assert refused.returncode != 0, "another node: refused"
        assert (
            "the trainwave agent may change only the Node its pod runs on: this token is "
            f"bound to a pod on {node_a}, not to one on {node_b}" in refused.stderr
        ), refused.stderr
        assert "ValidatingAdmissionPolicy 'trainwave-agent-own-node'" in refused.stderr
        assert f"not to one on {node_b}" in patch_status(on_a, node_b), "another's status: refused"

        assert label(on_b, node_b, "b").returncode == 0, "B's own token changes B"
        labels = json.loads(cluster.kubectl("get", "nodes", node_a, node_b, "-o", "json").stdout)
        assert [n["metadata"]["labels"].get(LABEL) for n in labels["items"]] == ["a", "b"]
    finally:
        delete_pod(cluster, pod_a)
        delete_pod(cluster, pod_b)


def test_a_token_bound_to_no_pod_changes_no_node(
    trainwave_installed: Cluster, two_nodes: tuple[str, str], tmp_path: Path
) -> None:
    unbound = service_account_kubeconfig(
        trainwave_installed, tmp_path / "unbound", account=AGENT_ACCOUNT
    )
    refused = label(unbound, two_nodes[0], "x")
    assert refused.returncode != 0
    assert "this token is bound to no pod on a node" in refused.stderr, refused.stderr
    # RBAC still lets it read: the policy only judges changes.
    assert kubectl_as(unbound, "get", "node", two_nodes[0]).returncode == 0
