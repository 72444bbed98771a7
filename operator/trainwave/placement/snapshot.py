"""ClusterSnapshot: what the placement engine knows about the cluster at one moment. Pure.

The controller lists Nodes and bound Pods and calls `build_snapshot` once per decision
cycle; everything after that reads the snapshot, never the API. A snapshot is immutable:
`with_usage` returns a new one that shares the topology tree (labels did not change), so
the queue can try gang after gang against the GPUs left by the ones before.

What counts as used: every pod bound to a node (`spec.nodeName`) that has not finished,
including pods being deleted (the kubelet still holds their GPUs), plus `reserved` GPUs
the caller passes for gangs it has placed but kube-scheduler has not bound yet.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from trainwave.contract import ANNOTATION_INVENTORY, GPU_RESOURCE
from trainwave.placement.topology import (
    DEFAULT_LEVELS,
    DEFAULT_NVLINK_LABELS,
    Topology,
    build_topology,
)

_FINISHED = frozenset({"Succeeded", "Failed"})
_BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
# GPU nodes are commonly tainted with the GPU resource name; the ExtendedResourceToleration
# admission plugin makes every pod requesting GPUs tolerate it.
DEFAULT_TOLERATED_TAINTS = (GPU_RESOURCE,)


# Node label requirements: a value must equal a string, or be one of a set.
Selector = Mapping[str, str | frozenset[str]]


def label_matches(value: str | None, wanted: str | frozenset[str]) -> bool:
    return value in wanted if isinstance(wanted, frozenset) else value == wanted


@dataclass(frozen=True, slots=True)
class NodeInfo:
    name: str
    labels: Mapping[str, str]
    gpus: int  # allocatable
    used: int = 0
    schedulable: bool = True

    @property
    def free(self) -> int:
        return max(0, self.gpus - self.used) if self.schedulable else 0


@dataclass(frozen=True, eq=False)
class ClusterSnapshot:
    """Nodes in topology order: `nodes[i]` is `topology.node_names[i]`."""

    topology: Topology
    nodes: tuple[NodeInfo, ...]
    # Selector matches depend on labels only, so snapshots derived from this one share them.
    _matches: dict[tuple[tuple[str, str | frozenset[str]], ...], tuple[bool, ...]] = field(
        default_factory=dict, repr=False
    )

    @classmethod
    def of(
        cls,
        nodes: Iterable[NodeInfo],
        levels: Sequence[str] = DEFAULT_LEVELS,
        nvlink_labels: Sequence[str] = DEFAULT_NVLINK_LABELS,
    ) -> ClusterSnapshot:
        by_name = {node.name: node for node in nodes}
        topology = build_topology(
            levels, ((n.name, n.labels) for n in by_name.values()), nvlink_labels
        )
        return cls(topology, tuple(by_name[name] for name in topology.node_names))

    @cached_property
    def free(self) -> tuple[int, ...]:
        """Free GPUs per node index; 0 on nodes that take no new pods."""
        return tuple(node.free for node in self.nodes)

    def matching(self, selector: Selector) -> tuple[bool, ...]:
        """Per node index: whether its labels match every term of `selector`."""
        key = tuple(sorted(selector.items()))
        if key not in self._matches:
            self._matches[key] = tuple(
                all(label_matches(node.labels.get(k), v) for k, v in key) for node in self.nodes
            )
        return self._matches[key]

    def node(self, name: str) -> NodeInfo:
        return self.nodes[self.topology.node_index[name]]

    def with_usage(self, gpus_by_node: Mapping[str, int]) -> ClusterSnapshot:
        """A snapshot with more GPUs used (negative counts give them back)."""
        nodes = list(self.nodes)
        for name, gpus in gpus_by_node.items():
            index = self.topology.node_index[name]
            nodes[index] = replace(nodes[index], used=nodes[index].used + gpus)
        return ClusterSnapshot(self.topology, tuple(nodes), self._matches)

    def emptied(self) -> ClusterSnapshot:
        """The same cluster with nothing running: what could ever fit, for now."""
        return ClusterSnapshot(
            self.topology,
            tuple(NodeInfo(n.name, n.labels, n.gpus, 0, n.schedulable) for n in self.nodes),
            self._matches,
        )

    def restricted(self, names: Iterable[str]) -> ClusterSnapshot:
        """The same snapshot with only `names` open to new pods."""
        keep = set(names)
        return ClusterSnapshot(
            self.topology,
            tuple(
                n if n.name in keep else NodeInfo(n.name, n.labels, n.gpus, n.used, False)
                for n in self.nodes
            ),
            self._matches,
        )


def build_snapshot(
    nodes: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    *,
    levels: Sequence[str] = DEFAULT_LEVELS,
    nvlink_labels: Sequence[str] = DEFAULT_NVLINK_LABELS,
    reserved: Mapping[str, int] | None = None,
    tolerated_taints: Sequence[str] = DEFAULT_TOLERATED_TAINTS,
) -> ClusterSnapshot:
    """A snapshot from raw Node and Pod objects, as the API server returns them."""
    used = dict(reserved or {})
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if node and (pod.get("status") or {}).get("phase") not in _FINISHED:
            used[node] = used.get(node, 0) + pod_gpus(pod)
    infos = []
    for node in nodes:
        metadata = node.get("metadata") or {}
        name = metadata["name"]
        infos.append(
            NodeInfo(
                name=name,
                labels=dict(metadata.get("labels") or {}),
                gpus=_node_gpus(node),
                used=used.get(name, 0),
                schedulable=node_schedulable(node, tolerated_taints),
            )
        )
    return ClusterSnapshot.of(infos, levels, nvlink_labels)


def pod_gpus(pod: Mapping[str, Any]) -> int:
    """GPUs a pod holds: its containers' sum, or its largest init container if larger."""
    spec = pod.get("spec") or {}
    running = sum(_container_gpus(c) for c in spec.get("containers") or ())
    init = max((_container_gpus(c) for c in spec.get("initContainers") or ()), default=0)
    return max(running, init)


def node_schedulable(node: Mapping[str, Any], tolerated_taints: Sequence[str]) -> bool:
    """False when cordoned, not Ready, or tainted with anything a worker does not tolerate."""
    spec = node.get("spec") or {}
    if spec.get("unschedulable"):
        return False
    for taint in spec.get("taints") or ():
        if taint.get("effect") in _BLOCKING_EFFECTS and taint.get("key") not in tolerated_taints:
            return False
    for condition in (node.get("status") or {}).get("conditions") or ():
        if condition.get("type") == "Ready":
            return bool(condition.get("status") == "True")
    return True  # no conditions yet: a node just registered, not a node known to be down


def _node_gpus(node: Mapping[str, Any]) -> int:
    """Whole GPUs for gangs: allocatable, less those the agent offers for sharing.

    The device plugin still counts shared GPUs in nvidia.com/gpu; placing a
    gang on them would run it next to the shared jobs pinned there.
    """
    status = node.get("status") or {}
    amounts = status.get("allocatable") or status.get("capacity") or {}
    return max(0, _count(amounts.get(GPU_RESOURCE)) - _shared_gpus(node))


def read_inventory(node: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The node agent's inventory annotation, parsed; None when absent or unreadable
    (the agent rewrites it on its next pass)."""
    annotations = (node.get("metadata") or {}).get("annotations") or {}
    text = annotations.get(ANNOTATION_INVENTORY)
    if not text:
        return None
    try:
        found = json.loads(text)
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


def _shared_gpus(node: Mapping[str, Any]) -> int:
    inventory = read_inventory(node)
    return len(inventory.get("sharedGpus") or ()) if inventory else 0


def _container_gpus(container: Mapping[str, Any]) -> int:
    # Extended resources must set a limit; a request, when present, equals it.
    resources = container.get("resources") or {}
    for kind in ("limits", "requests"):
        amount = (resources.get(kind) or {}).get(GPU_RESOURCE)
        if amount is not None:
            return _count(amount)
    return 0


def _count(amount: object) -> int:
    """A whole-device quantity ("8", 8); anything else counts as none."""
    try:
        return max(0, int(str(amount)))
    except ValueError:
        return 0
