"""Stand-ins for the agent DaemonSet's pods, so tokens can be bound to a pod on a node.

The agent runs here as a local process, not in a pod; the chart's admission policy lets
its ServiceAccount change only the Node named in its token, and only pod-bound tokens
name one. A pod of the agent's account bound to the node (kwok pretends to run it) gives
the test the same token the kubelet would mount into the real agent.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import yaml

from cluster.controlplane import Cluster
from cluster.deploy import NAMESPACE, RELEASE, service_account_kubeconfig

AGENT_ACCOUNT = f"{RELEASE}-agent"


def agent_pod_on(cluster: Cluster, node: str) -> str:
    """A pod of the agent's ServiceAccount bound to `node` (which need not exist yet)."""
    name = f"agent-stand-in-{uuid.uuid4().hex[:8]}"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "nodeName": node,
            "serviceAccountName": AGENT_ACCOUNT,
            "automountServiceAccountToken": False,
            "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "agent", "image": "trainwave/agent:test"}],
        },
    }
    cluster.kubectl("create", "-f", "-", input=yaml.safe_dump(pod))
    return name


def agent_kubeconfig_on(cluster: Cluster, node: str, path: Path) -> tuple[Path, str]:
    """A kubeconfig with the agent's token bound to a new pod on `node`, and that pod's name."""
    pod = agent_pod_on(cluster, node)
    return service_account_kubeconfig(cluster, path, account=AGENT_ACCOUNT, bound_pod=pod), pod


def delete_pod(cluster: Cluster, name: str) -> None:
    cluster.kubectl("delete", "pod", name, "-n", NAMESPACE, "--wait=false", check=False)
