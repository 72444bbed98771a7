"""Private pools of simulated GPU nodes for tests that need an exact cluster shape.

A pool is a handful of kwok nodes with their own racks and a pool label; jobs
reach them through a nodeSelector, so a test can fragment or fill its pool
without racing other tests on the shared nodes. Pools are deleted afterwards.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from cluster.controlplane import Cluster
from cluster.inventory import simulated_gpus
from cluster.topology import KWOK_NODE_ANNOTATION, KWOK_NODE_TYPE_LABEL, NodeShape, build_node
from trainwave.agent.slices import NodeRef, build_slices

POOL_LABEL = "test.trainwave.io/pool"
H100 = {"product": "NVIDIA-H100-80GB-HBM3", "count": 8, "memoryMiB": 81559}


@dataclass(frozen=True)
class Pool:
    name: str
    racks: dict[str, list[str]]  # rack -> node names, in order

    @property
    def selector(self) -> dict[str, str]:
        return {POOL_LABEL: self.name}

    @property
    def nodes(self) -> list[str]:
        return [node for nodes in self.racks.values() for node in nodes]

    def rack_of(self, node: str) -> str:
        return next(rack for rack, nodes in self.racks.items() if node in nodes)


@contextmanager
def node_pool(
    cluster: Cluster,
    rack_sizes: tuple[int, ...],
    shape: dict[str, Any] | None = None,
    *,
    gpu_slices: bool = False,
    played: bool = True,
) -> Iterator[Pool]:
    """`gpu_slices`: also publish each node's shared GPUs as DRA ResourceSlices, built by
    the agent's own code (agent/slices.py), as `trainwave agent --gpu-slices` would.
    `played=False`: no kwok plays the nodes; they are created Ready (a heartbeat now, good
    for the node monitor's grace period) and their pods stay as bound until the test
    writes their status, as a kubelet would."""
    pool_id = f"p{uuid.uuid4().hex[:6]}"
    node_shape = NodeShape.model_validate(shape or {"cpu": "192", "gpu": H100})
    manifests, racks = [], {}
    for index, size in enumerate(rack_sizes):
        rack = f"{pool_id}-rack-{index}"
        racks[rack] = []
        for position in range(size):
            name = f"{pool_id}-r{index}-n{position}"
            node = build_node(
                pool_id, name, spine=f"{pool_id}-spine", rack=rack, position=position,
                shape=node_shape,
            )  # fmt: skip
            node["metadata"]["labels"][POOL_LABEL] = pool_id
            if not played:
                _unplayed(node)
            manifests.append(node)
            racks[rack].append(name)
    document = json.dumps({"apiVersion": "v1", "kind": "List", "items": manifests})
    cluster.kubectl("create", "-f", "-", input=document)
    pool = Pool(pool_id, racks)
    try:
        names = [f"node/{n}" for n in pool.nodes]
        cluster.kubectl("wait", "--for=condition=Ready", *names, "--timeout=60s")
        if gpu_slices:
            _publish_slices(cluster, pool, node_shape)
        yield pool
    finally:
        cluster.kubectl(
            "delete", "nodes", "-l", f"{POOL_LABEL}={pool_id}", "--wait=false", check=False
        )


def _unplayed(node: dict[str, Any]) -> None:
    node["metadata"]["annotations"].pop(KWOK_NODE_ANNOTATION)
    node["metadata"]["labels"].pop(KWOK_NODE_TYPE_LABEL)
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    ready = {"type": "Ready", "status": "True", "reason": "KubeletReady",
             "message": "a test plays this node", "lastHeartbeatTime": now,
             "lastTransitionTime": now}  # fmt: skip
    node["status"]["conditions"] = [ready]


def _publish_slices(cluster: Cluster, pool: Pool, shape: NodeShape) -> None:
    assert shape.gpu is not None, "slices are for shared GPUs"
    assert shape.gpu.shared, "slices are for shared GPUs"
    slices = []
    for name in pool.nodes:
        uid = cluster.kubectl("get", "node", name, "-o", "jsonpath={.metadata.uid}").stdout
        gpus = simulated_gpus(
            name, gpus=shape.gpu.count, product=shape.gpu.product, memory_mib=shape.gpu.memory_mib
        )
        slices += build_slices(NodeRef(name, uid.strip()), gpus, generation=1)
    document = json.dumps({"apiVersion": "v1", "kind": "List", "items": slices})
    cluster.kubectl("create", "-f", "-", input=document)


def blocker_pod(
    name: str, node: str, gpus: int, requests: dict[str, str] | None = None
) -> dict[str, Any]:
    """A plain pod bound straight to `node` (no scheduler) that holds `gpus` GPUs
    and, if given, `requests` (cpu, memory, ...)."""
    resources: dict[str, Any] = {"limits": {"nvidia.com/gpu": gpus} if gpus else {}}
    if requests:
        resources["requests"] = dict(requests)
        # Extended resources (a "/" in the name) must be limited to what is requested.
        resources["limits"] |= {k: v for k, v in requests.items() if "/" in k}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeName": node,
            "containers": [
                {
                    "name": "hold",
                    "image": "busybox",
                    "resources": resources,
                }
            ],
        },
    }
