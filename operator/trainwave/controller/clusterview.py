"""What placement sees of the cluster at one moment, from the watch cache or a listing.

The operator's placer reads a `ClusterView` from its watch-backed cache every
round (cluster_cache.py); `trainwave plan` has no cache and builds the same view
from one fresh listing. Both aggregate pod records the same way (`aggregate`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from trainwave.placement.records import NodeRecord, PodRecord, node_record, pod_record
from trainwave.placement.snapshot import NodeUsage, usage_of

JobKey = tuple[str, str]


@dataclass(frozen=True)
class ClusterView:
    nodes: tuple[NodeRecord, ...]
    usage: Mapping[str, NodeUsage]  # per node: what holding pods use
    gated: Mapping[JobKey, tuple[PodRecord, ...]]  # trainwave workers behind the gate
    workers: Mapping[JobKey, tuple[PodRecord, ...]]  # trainwave workers holding resources
    labels_version: int = 0  # changes when node names or labels do: the tree is rebuilt
    shared_shapes: tuple[int, ...] = ()  # MiB of each running shared worker


def aggregate(
    nodes: Iterable[NodeRecord], pods: Iterable[PodRecord], labels_version: int = 0
) -> ClusterView:
    records = list(pods)
    gated: dict[JobKey, list[PodRecord]] = {}
    workers: dict[JobKey, list[PodRecord]] = {}
    for record in records:
        if record.worker is None:
            continue
        key = (record.namespace, record.worker.job)
        if record.gated and not record.deleting:
            gated.setdefault(key, []).append(record)
        if record.holds:
            workers.setdefault(key, []).append(record)
    return ClusterView(
        nodes=tuple(nodes),
        usage=usage_of(records),
        gated={k: tuple(v) for k, v in gated.items()},
        workers={k: tuple(v) for k, v in workers.items()},
        labels_version=labels_version,
        shared_shapes=tuple(r.gpu_mib for r in records if r.holds and r.gpu_uuid),
    )


def view_of(
    raw_nodes: Iterable[Mapping[str, Any]], raw_pods: Iterable[Mapping[str, Any]]
) -> ClusterView:
    """A view from raw objects, as one listing returns them."""
    records = (pod_record(pod) for pod in raw_pods)
    return aggregate(
        (node_record(node) for node in raw_nodes), (r for r in records if r is not None)
    )
