"""Factories for the placement engine's inputs: nodes, whole clusters, gang requests.

A cluster is written the way one draws it: `make_cluster([8, 8, 0], [8, 4])` is two racks,
the first with three nodes (8, 8 and 0 GPUs free), the second with two.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cluster.topology import build_nodes, load_topology, parse_topology
from trainwave.contract import NODE_LABEL_NVLINK_DOMAIN, NODE_LABEL_RACK, NODE_LABEL_SPINE
from trainwave.placement.gang_types import GangRequest, Placement, Unschedulable
from trainwave.placement.ranks import Parallelism
from trainwave.placement.snapshot import ClusterSnapshot, NodeInfo, build_snapshot
from trainwave.placement.topology import HOSTNAME_LABEL

TOPOLOGIES = Path(__file__).resolve().parents[1] / "cluster" / "topologies"
H100 = "NVIDIA-H100-80GB-HBM3"


def make_node(
    name: str = "n0",
    *,
    rack: str | None = "rack-0",
    spine: str | None = "spine-0",
    gpus: int = 8,
    free: int | None = None,
    nvlink: str | None = None,
    labels: Mapping[str, str] | None = None,
    schedulable: bool = True,
) -> NodeInfo:
    """A node; `free` defaults to all of its GPUs, a None rack or spine leaves the label off."""
    all_labels = {HOSTNAME_LABEL: name, **(labels or {})}
    for key, value in ((NODE_LABEL_SPINE, spine), (NODE_LABEL_RACK, rack)):
        if value is not None:
            all_labels[key] = value
    if nvlink is not None:
        all_labels[NODE_LABEL_NVLINK_DOMAIN] = nvlink
    used = 0 if free is None else gpus - free
    return NodeInfo(name, all_labels, gpus, used, schedulable)


def make_cluster(
    *racks: Sequence[int], spines: Sequence[int] = (), gpus: int = 8, nvlink: int = 1
) -> ClusterSnapshot:
    """Racks as free GPUs per node; `spines` counts racks per spine (default: one spine);
    `nvlink` groups that many consecutive nodes of a rack into one NVLink domain."""
    spine_of = [index for index, count in enumerate(spines) for _ in range(count)]
    nodes = []
    for rack, frees in enumerate(racks):
        spine = f"spine-{spine_of[rack] if spines else 0}"
        for position, free in enumerate(frees):
            domain = f"rack-{rack}-nvl{position // nvlink}" if nvlink > 1 else None
            nodes.append(
                make_node(
                    f"r{rack}-n{position}",
                    rack=f"rack-{rack}",
                    spine=spine,
                    gpus=gpus,
                    free=free,
                    nvlink=domain,
                )
            )
    return ClusterSnapshot.of(nodes)


def make_request(
    workers: int,
    gpus: int = 8,
    *,
    name: str = "job",
    tensor: int | None = None,
    pipeline: int | None = None,
    **fields: Any,
) -> GangRequest:
    parallelism = None
    if tensor is not None or pipeline is not None:
        parallelism = Parallelism(tensor=tensor or 1, pipeline=pipeline or 1)
    return GangRequest(name, workers, gpus, parallelism=parallelism, **fields)


def topology_snapshot(name: str, document: dict[str, Any] | None = None) -> ClusterSnapshot:
    """An empty snapshot of tests/cluster/topologies/<name>.yaml, or of a document."""
    if document is not None:
        nodes = build_nodes(parse_topology(document))
    else:
        nodes = build_nodes(load_topology(TOPOLOGIES / f"{name}.yaml"))
    return build_snapshot(nodes, [])


def nvl_topology(racks: int = 2, nodes: int = 8, per_domain: int = 4) -> ClusterSnapshot:
    """GB200-like racks: NVLink domains of `per_domain` nodes inside each rack."""
    document = {
        "name": "nvl",
        "node": {
            "gpu": {"product": "NVIDIA-GB200", "count": 4, "memoryMiB": 189471},
            "nvlink": {"nodesPerDomain": per_domain},
        },
        "spines": [{"racks": [{"count": racks, "nodes": nodes}]}],
    }
    return topology_snapshot("nvl", document)


def placed(result: Placement | Unschedulable) -> Placement:
    assert isinstance(result, Placement), result
    return result


def refused(result: Placement | Unschedulable) -> Unschedulable:
    assert isinstance(result, Unschedulable), result
    return result
