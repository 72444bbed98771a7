"""kube-scheduler's filters, mirrored: may this pod go to this node, and if not, why. Pure.

A node is a candidate for a worker only if the worker's pod passes the filters
kube-scheduler v1.34 runs, in its order (k/k pkg/scheduler/apis/config/v1/
default_plugins.go), stopping at the first that rejects, as `RunFilterPlugins`
does, so each node has one reason (NodeResourcesFit may name several resources):

  NodeUnschedulable  a cordoned node, unless the pod tolerates
                     node.kubernetes.io/unschedulable:NoSchedule
  (NotReady)         ours, not kube-scheduler's: a node whose Ready condition is not
                     True. kube-scheduler waits for the node lifecycle controller's
                     not-ready/unreachable taint (up to 50 s); a gang pinned there
                     meanwhile would bind to a dead kubelet.
  NodeName           spec.nodeName, when set, must be this node
  TaintToleration    every NoSchedule and NoExecute taint must be tolerated
                     (PreferNoSchedule only scores; tolerationSeconds is ignored here)
  NodeAffinity       nodeSelector AND required node affinity (terms ORed,
                     expressions ANDed; component-helpers nodeaffinity)
  NodePorts          no (hostIP, protocol, port) clash; 0.0.0.0 clashes with any IP
  NodeResourcesFit   pod count, then every requested resource: request <=
                     allocatable - requested (cpu, memory, ephemeral-storage,
                     hugepages-*, extended resources such as nvidia.com/gpu,
                     rdma/*, trainwave.io/gpu-memory)
  PodTopologySpread  the node carries the topologyKey of every DoNotSchedule
                     constraint (podtopologyspread/filtering.go `Filter`); the skew
                     part depends on where the gang's other workers go, so spread.py
                     checks it for the whole gang

`worker_slots` goes one step further than kube-scheduler: how many workers of
the same pod fit at once, which is what gang placement needs.

Whole GPUs are counted the engine's way, stricter than kube-scheduler: GPUs the
node agent offers for sharing are not free for whole-GPU workers.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from trainwave.contract import GPU_RESOURCE
from trainwave.placement.quantities import show
from trainwave.placement.requirements import (
    UNSCHEDULABLE_TAINT,
    PodNeeds,
    Requirement,
    Taint,
    Term,
    label_requirement_matches,
)

if TYPE_CHECKING:
    from trainwave.placement.snapshot import NodeInfo

_BLOCKING = ("NoSchedule", "NoExecute")
_NAME_FIELD = "metadata.name"
# A pod with no requests fits any number of times, up to the node's pod limit.
_UNBOUNDED = 1 << 30


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why one node refuses one pod: a filter and what it found."""

    filter: str  # the kube-scheduler plugin (or NotReady)
    what: str  # the grouping key in messages: "untolerated taint {team: vision}"
    resource: str = ""  # NodeResourcesFit: the short resource
    needs: int = 0
    free: int = 0


def check(needs: PodNeeds, node: NodeInfo) -> tuple[Rejection, ...]:
    """The first filter that rejects `node` for one pod of `needs`; () when it fits."""
    for rejected in (
        _unschedulable(needs, node),
        _not_ready(node),
        _node_name(needs, node),
        _taints(needs, node),
        affinity_rejection(needs, node),
        _ports(needs, node),
    ):
        if rejected is not None:
            return (rejected,)
    short = _resources(needs, node)
    if short:
        return short
    missing = _spread_labels(needs, node)
    return () if missing is None else (missing,)


def worker_slots(needs: PodNeeds, node: NodeInfo) -> int:
    """How many pods of `needs` fit on `node` at once; 0 when any filter rejects it."""
    if not node.schedulable or check(needs, node):
        return 0
    slots = min(_UNBOUNDED, node.max_pods - node.pods)
    if needs.host_ports:
        slots = min(slots, 1)  # a second worker would clash with the first one's ports
    for resource, wanted in needs.requests:
        if wanted > 0:
            slots = min(slots, free_amount(node, resource) // wanted)
    return max(0, slots)


def free_amount(node: NodeInfo, resource: str) -> int:
    if resource == GPU_RESOURCE:
        return node.free_whole_gpus
    return node.allocatable.get(resource, 0) - node.requested.get(resource, 0)


def preference(needs: PodNeeds, node: NodeInfo) -> int:
    """Preferred node affinity: the sum of the weights of the terms the node matches."""
    return sum(
        weight for weight, term in needs.preferred_terms if not term.empty and _matches(term, node)
    )


def _unschedulable(needs: PodNeeds, node: NodeInfo) -> Rejection | None:
    if not node.cordoned:
        return None
    taint = Taint(UNSCHEDULABLE_TAINT, "", "NoSchedule")
    if any(t.tolerates(taint) for t in needs.tolerations):
        return None
    return Rejection("NodeUnschedulable", "cordoned")


def _not_ready(node: NodeInfo) -> Rejection | None:
    return None if node.ready else Rejection("NotReady", "not Ready")


def _node_name(needs: PodNeeds, node: NodeInfo) -> Rejection | None:
    if not needs.node_name or needs.node_name == node.name:
        return None
    return Rejection("NodeName", f"not the requested node {needs.node_name}")


def _taints(needs: PodNeeds, node: NodeInfo) -> Rejection | None:
    for taint in node.taints:
        if taint.effect in _BLOCKING and not any(t.tolerates(taint) for t in needs.tolerations):
            return Rejection("TaintToleration", f"untolerated taint {taint}")
    return None


def affinity_rejection(needs: PodNeeds, node: NodeInfo) -> Rejection | None:
    """NodeAffinity: nodeSelector AND required node affinity."""
    for key, value in needs.node_selector:
        if node.labels.get(key) != value:
            return Rejection("NodeAffinity", f"not matching nodeSelector {key}={value}")
    terms = needs.required_terms
    if terms is None:
        return None
    if not any(_matches(term, node) for term in terms if not term.empty):
        return Rejection("NodeAffinity", "not matching required node affinity")
    return None


def _ports(needs: PodNeeds, node: NodeInfo) -> Rejection | None:
    for ip, protocol, port in needs.host_ports:
        for used_ip, used_protocol, used_port in node.host_ports:
            if port != used_port or protocol != used_protocol:
                continue
            if ip == used_ip or "0.0.0.0" in (ip, used_ip):
                return Rejection("NodePorts", f"host port {port}/{protocol} in use")
    return None


def _resources(needs: PodNeeds, node: NodeInfo) -> tuple[Rejection, ...]:
    if node.pods + 1 > node.max_pods:
        return (Rejection("NodeResourcesFit", "too many pods", "pods", 1, 0),)
    short = []
    for resource, wanted in needs.requests:
        free = free_amount(node, resource)
        if wanted > 0 and wanted > free:
            short.append(_short(resource, wanted, free, node))
    return tuple(short)


def _spread_labels(needs: PodNeeds, node: NodeInfo) -> Rejection | None:
    for constraint in needs.spread:
        if constraint.hard and constraint.topology_key not in node.labels:
            what = f"missing topology label {constraint.topology_key}"
            return Rejection("PodTopologySpread", what)
    return None


def _short(resource: str, wanted: int, free: int, node: NodeInfo) -> Rejection:
    if resource == GPU_RESOURCE and node.shared and node.gpus == 0:
        # Every GPU is offered for sharing: not "busy", never for whole-GPU workers.
        return Rejection("NodeResourcesFit", "GPUs offered for sharing only", resource, wanted, 0)
    counted = resource == GPU_RESOURCE or "/" in resource
    what = f"too few free {resource}" if counted else f"too little {resource}"
    return Rejection("NodeResourcesFit", what, resource, wanted, max(0, free))


def _matches(term: Term, node: NodeInfo) -> bool:
    return all(label_requirement_matches(r, node.labels) for r in term.expressions) and all(
        _field(r, node.name) for r in term.fields
    )


def _field(requirement: Requirement, name: str) -> bool:
    """matchFields: only metadata.name with In/NotIn is valid."""
    if requirement.key != _NAME_FIELD:
        return False
    if requirement.operator == "In":
        return name in requirement.values
    if requirement.operator == "NotIn":
        return name not in requirement.values
    return False


def describe(
    nodes_total: int,
    rejections: Iterable[tuple[Rejection, ...]],
    subject: str = "a worker",
) -> str:
    """'0/64 nodes fit a worker: 48 too few free nvidia.com/gpu, 8 untolerated taint ...'.

    Like kube-scheduler's FitError, each reason is counted once per node; unlike it,
    the reasons are ordered by count (most common first), and resource shortfalls
    say what was asked and the most any such node has free.
    """
    counts: Counter[str] = Counter()
    largest: dict[str, Rejection] = {}
    rejected = 0
    for reasons in rejections:
        if not reasons:
            continue
        rejected += 1
        for reason in reasons:
            counts[reason.what] += 1
            best = largest.get(reason.what)
            if reason.resource and (best is None or reason.free > best.free):
                largest[reason.what] = reason
    fit = nodes_total - rejected
    parts = []
    for what, count in sorted(counts.items(), key=lambda item: (-item[1], item[0])):
        detail = ""
        if what in largest and what.startswith("too "):
            r = largest[what]
            detail = (
                f" (needs {show(r.resource, r.needs)}, largest free {show(r.resource, r.free)})"
            )
        parts.append(f"{count} {what}{detail}")
    head = f"{fit}/{nodes_total} nodes fit {subject}"
    return f"{head}: {', '.join(parts)}" if parts else head


def rejected_by(rejections: Sequence[tuple[Rejection, ...]]) -> frozenset[str]:
    """The filters that rejected at least one node."""
    return frozenset(r.filter for reasons in rejections for r in reasons)
