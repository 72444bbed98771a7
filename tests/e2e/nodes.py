"""The test kubelet's Nodes: what they look like, and the heartbeat that keeps them Ready.

They carry the labels and capacity of the simulated GPU nodes (built by
tests/cluster/topology.py's `build_node`, so placement sees the same kind of
node) minus what hands a node to kwok: kwok manages only nodes annotated
`kwok.x-k8s.io/node`, and `cluster up` only reconciles nodes labelled
`type=kwok`, so neither touches these. The node lifecycle controller marks a
node NotReady when neither its Ready condition's heartbeat nor its Lease
moves for the monitor grace period; the kubelet renews both.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from cluster.topology import (
    KWOK_NODE_ANNOTATION,
    KWOK_NODE_TYPE_LABEL,
    NodeShape,
    build_node,
)

# Marks the nodes of one test kubelet, so jobs reach them with a nodeSelector.
KUBELET_LABEL = "test.trainwave.io/kubelet"
NODE_IP = "127.0.0.1"
LEASE_NAMESPACE = "kube-node-lease"
LEASE_SECONDS = 40
SHAPE = NodeShape.model_validate(
    {"cpu": "16", "gpu": {"product": "NVIDIA-H100-80GB-HBM3", "count": 8, "memoryMiB": 81559}}
)


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_micro() -> str:
    """MicroTime, as Leases want it: six fraction digits, always."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def build_kubelet_node(
    name: str,
    kubelet_id: str,
    *,
    rack: str,
    position: int,
    log_port: int,
    shape: NodeShape = SHAPE,
) -> dict[str, Any]:
    node = build_node(
        kubelet_id, name, spine=f"{kubelet_id}-spine", rack=rack, position=position, shape=shape
    )
    node["metadata"]["annotations"].pop(KWOK_NODE_ANNOTATION)
    node["metadata"]["labels"].pop(KWOK_NODE_TYPE_LABEL)
    node["metadata"]["labels"][KUBELET_LABEL] = kubelet_id
    node["status"] |= {
        "conditions": conditions(now_rfc3339()),
        # No Hostname address: the API server prefers it for reaching the kubelet (its
        # --kubelet-preferred-address-types default) and the node's name resolves nowhere.
        "addresses": [{"type": "InternalIP", "address": NODE_IP}],
        # Where the API server asks for pod logs (logserver.py): one port for both nodes.
        "daemonEndpoints": {"kubeletEndpoint": {"Port": log_port}},
    }
    return node


def conditions(heartbeat: str) -> list[dict[str, str]]:
    def condition(kind: str, status: str, reason: str, message: str) -> dict[str, str]:
        return {
            "type": kind,
            "status": status,
            "reason": reason,
            "message": message,
            "lastHeartbeatTime": heartbeat,
            "lastTransitionTime": heartbeat,
        }

    return [
        condition("Ready", "True", "KubeletReady", "test kubelet is posting ready status"),
        condition("MemoryPressure", "False", "KubeletHasSufficientMemory", "no pressure"),
        condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "no pressure"),
        condition("PIDPressure", "False", "KubeletHasSufficientPID", "no pressure"),
    ]


def heartbeat(core: client.CoreV1Api, leases: client.CoordinationV1Api, name: str) -> None:
    """Renew the node's Lease and the heartbeat of its conditions."""
    now = now_rfc3339()
    current = core.read_node_status(name, _preload_content=False)
    transitions = {
        c["type"]: c.get("lastTransitionTime")
        for c in (_json(current).get("status") or {}).get("conditions") or []
    }
    fresh = conditions(now)
    for condition in fresh:
        condition["lastTransitionTime"] = transitions.get(condition["type"]) or now
    # Strategic merge: conditions merge by type, the rest of the status is kept.
    core.patch_node_status(
        name,
        {"status": {"conditions": fresh}},
        _content_type="application/strategic-merge-patch+json",
        _preload_content=False,
    )
    _renew_lease(leases, name)


def _renew_lease(leases: client.CoordinationV1Api, name: str) -> None:
    spec = {"holderIdentity": name, "leaseDurationSeconds": LEASE_SECONDS, "renewTime": now_micro()}
    try:
        leases.patch_namespaced_lease(
            name, LEASE_NAMESPACE, {"spec": spec},
            _content_type="application/merge-patch+json", _preload_content=False,
        )  # fmt: skip
    except ApiException as error:
        if error.status != 404:
            raise
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": name}, "spec": spec}  # fmt: skip
        leases.create_namespaced_lease(LEASE_NAMESPACE, body, _preload_content=False)


def delete_node(core: client.CoreV1Api, leases: client.CoordinationV1Api, name: str) -> None:
    for delete in (
        lambda: core.delete_node(name),
        lambda: leases.delete_namespaced_lease(name, LEASE_NAMESPACE),
    ):
        try:
            delete()
        except ApiException as error:
            if error.status != 404:
                raise


def _json(response: Any) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(response.data)
    return document
