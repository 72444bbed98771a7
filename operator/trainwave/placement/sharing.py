"""Shared GPUs: which GPU of which node each worker of a shared-GPU job gets. Pure.

Algorithm overview
------------------
Nodes offer some GPUs for sharing (the node agent lists them, with UUID and
memory, in its inventory annotation, and advertises their memory as the
extended resource trainwave.io/gpu-memory so kube-scheduler accounts for it
per node). Per GPU, the free memory is its size minus the requests of the
pods pinned to it (bound, or released and not bound yet). A worker asks for
memory on one GPU; memory is turned into the fraction of that GPU (milli-GPU,
rounded up) and the packing policy (packing.py: fgd-consolidate, FGD's
fragmentation gradient with ties consolidated) picks the node and GPU. The
worker's task carries its pod's real CPU and memory requests and each node its
free CPU and memory (shared_tasks.py), so the packer's filter agrees with
kube-scheduler's and its fragmentation measure sees CPU a node would run out
of. Workers of one job are placed one after another on a working copy; if one
does not fit, none is placed (all or nothing) and the answer says why in
numbers.

Invariants: a GPU never gets more than its memory; only shared GPUs are used;
a node's whole-GPU capacity is untouched (shared GPUs are the agent's choice).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from trainwave.api.reasons import Reason
from trainwave.contract import NODE_LABEL_GPU_PRODUCT
from trainwave.placement.filters import Rejection, check, describe
from trainwave.placement.fragmentation import MILLI, FragmentationMeasure
from trainwave.placement.packing import FgdConsolidate, NodeState, Task, assign, choose
from trainwave.placement.quantities import CPU
from trainwave.placement.records import SharedGpu
from trainwave.placement.requirements import PodNeeds
from trainwave.placement.shared_tasks import (
    UNTRACKED,
    SharedShape,
    free_cpu_memory,
    gpu_milli,
    typical_measure,
    worker_task,
)
from trainwave.placement.snapshot import ClusterSnapshot, NodeInfo, build_snapshot

if TYPE_CHECKING:
    from trainwave.placement.gang_types import GangRequest

__all__ = [
    "Pin",
    "SharedGpu",
    "SharedNode",
    "SharedPlacement",
    "SharedRefusal",
    "place_shared",
    "shared_nodes",
]


@dataclass(frozen=True)
class SharedNode:
    name: str
    gpu_model: str
    gpus: tuple[SharedGpu, ...]
    schedulable: bool = True
    labels: Mapping[str, str] | None = None
    # Free CPU (millicores) and memory (bytes) for the packer; UNTRACKED: GPU memory alone.
    cpu_free: int = UNTRACKED
    memory_free: int = UNTRACKED


@dataclass(frozen=True)
class Pin:
    node: str
    gpu_uuid: str
    memory_mib: int


@dataclass(frozen=True)
class SharedRefusal:
    code: str
    reason: str


@dataclass(frozen=True)
class SharedPlacement:
    """Where each worker of a shared-GPU gang goes: pins[rank]."""

    job: str
    pins: tuple[Pin, ...]

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(pin.node for pin in self.pins)

    def workers_by_node(self) -> dict[str, int]:
        workers: dict[str, int] = {}
        for pin in self.pins:
            workers[pin.node] = workers.get(pin.node, 0) + 1
        return workers

    def gpu_mib(self) -> dict[str, int]:
        mib: dict[str, int] = {}
        for pin in self.pins:
            mib[pin.gpu_uuid] = mib.get(pin.gpu_uuid, 0) + pin.memory_mib
        return mib

    def describe(self) -> str:
        return "shared GPUs: " + ", ".join(f"{p.node}/{p.gpu_uuid[:12]}" for p in self.pins)


NO_SHARED_GPUS = "NoSharedGPUs"
NOT_ENOUGH_GPU_MEMORY = "NotEnoughGPUMemory"
# More than any shared GPU of the cluster has in all: waiting cannot help.
LARGER_THAN_ANY_GPU = Reason.LARGER_THAN_ANY_GPU


def place_shared(
    nodes: Iterable[SharedNode],
    workers: int,
    memory_mib: int,
    selector: Mapping[str, str] | None = None,
    active_requests: Iterable[SharedShape] = (),
    *,
    slots: Mapping[str, int] | None = None,
    pod: PodNeeds | None = None,
) -> tuple[Pin, ...] | SharedRefusal:
    """Pin each of `workers` to a shared GPU with `memory_mib` free, or say why not.

    `slots` caps how many workers each node takes (its other resources: CPU, memory,
    pods; filters.worker_slots); None leaves only GPU memory to decide. `pod` is the
    worker's pod: its CPU and memory requests go into the packer's task (None: none).
    """
    room = dict(slots) if slots is not None else None
    wanted = dict(selector or {})
    usable = [
        n
        for n in nodes
        if n.schedulable and n.gpus and all((n.labels or {}).get(k) == v for k, v in wanted.items())
    ]
    if not usable:
        where = f" matching {dict(selector)}" if selector else ""
        return SharedRefusal(NO_SHARED_GPUS, f"no schedulable node{where} offers shared GPUs")
    largest = max(g.memory_mib for n in usable for g in n.gpus)
    if memory_mib > largest:
        return SharedRefusal(
            LARGER_THAN_ANY_GPU,
            f"asks {memory_mib} MiB of one GPU; the largest shared GPU has {largest} MiB",
        )
    cpu = pod.amount(CPU) if pod is not None else 0
    policy = FgdConsolidate(measure(usable, SharedShape(memory_mib, cpu), active_requests))
    states = {n.name: _state(n) for n in usable}
    by_name = {n.name: n for n in usable}
    pins: list[Pin] = []
    for _ in range(workers):
        task = worker_task(pod, gpu_milli(memory_mib, _gpu_memory(by_name)))
        open_states = (
            states if room is None else {k: v for k, v in states.items() if room.get(k, 0) > 0}
        )
        choice = _choose_fitting(policy, open_states, by_name, task, memory_mib)
        if choice is None:
            placed = f"; {len(pins)} of {workers} workers would fit" if workers > 1 else ""
            return SharedRefusal(
                NOT_ENOUGH_GPU_MEMORY,
                f"needs {memory_mib} MiB on one GPU per worker; {most_free(by_name.values())}"
                f"{placed}",
            )
        node_name, gpu_index = choice
        node = by_name[node_name]
        gpu = next(g for g in node.gpus if g.index == gpu_index)
        pins.append(Pin(node_name, gpu.uuid, memory_mib))
        by_name[node_name] = _with_used(node, gpu_index, memory_mib)
        states[node_name] = assign(states[node_name], task, (_position(node, gpu_index),))
        if room is not None:
            room[node_name] -= 1
    return tuple(pins)


def measure(
    nodes: list[SharedNode], placing: SharedShape, active_requests: Iterable[SharedShape]
) -> FragmentationMeasure:
    """The fragmentation measure over the shapes this cluster sees: what runs, what is
    being placed, plus defaults."""
    return typical_measure(_gpu_memory({n.name: n for n in nodes}), (*active_requests, placing))


def _choose_fitting(
    policy: FgdConsolidate,
    states: dict[str, NodeState],
    nodes: dict[str, SharedNode],
    task: Task,
    memory_mib: int,
) -> tuple[str, int] | None:
    """The policy's choice, checked in MiB: milli rounding must never overfill a GPU."""
    candidates = dict(states)
    while candidates:
        choice = choose(policy, candidates.values(), task)
        if choice is None:
            return None
        node = nodes[choice.node]
        gpu = node.gpus[choice.gpus[0]]
        if gpu.free_mib >= memory_mib:
            return choice.node, gpu.index
        # Rounded milli said it fits, MiB says no: take that GPU out for this worker.
        free = list(candidates[choice.node].gpu_free)
        free[choice.gpus[0]] = 0
        candidates[choice.node] = replace(candidates[choice.node], gpu_free=tuple(free))
    return None


def _state(node: SharedNode) -> NodeState:
    return NodeState(
        node.name,
        node.gpu_model,
        node.cpu_free,
        node.memory_free,
        tuple(g.free_mib * MILLI // g.memory_mib if g.memory_mib else 0 for g in node.gpus),
    )


def _with_used(node: SharedNode, index: int, memory_mib: int) -> SharedNode:
    gpus = tuple(
        replace(g, used_mib=g.used_mib + memory_mib) if g.index == index else g for g in node.gpus
    )
    return replace(node, gpus=gpus)


def _position(node: SharedNode, index: int) -> int:
    return next(i for i, g in enumerate(node.gpus) if g.index == index)


def _gpu_memory(nodes: Mapping[str, SharedNode]) -> int:
    """The GPU size milli-GPU is measured against: the smallest shared GPU (conservative)."""
    return min(g.memory_mib for n in nodes.values() for g in n.gpus)


def shared_nodes(snapshot: ClusterSnapshot) -> list[SharedNode]:
    """The nodes that offer GPUs for sharing, with the memory pinned on each GPU and the
    CPU and memory free."""
    return [_shared_node(node) for node in snapshot.nodes if node.shared]


def _shared_node(node: NodeInfo) -> SharedNode:
    cpu_free, memory_free = free_cpu_memory(node)
    return SharedNode(
        name=node.name,
        gpu_model=node.labels.get(NODE_LABEL_GPU_PRODUCT, ""),
        gpus=node.shared,
        schedulable=node.schedulable and node.ready and not node.cordoned,
        labels=node.labels,
        cpu_free=cpu_free,
        memory_free=memory_free,
    )


def build_shared_nodes(
    nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]]
) -> list[SharedNode]:
    """Shared GPUs per node from raw Nodes (the agent's inventory) and the pods pinned to them."""
    return shared_nodes(build_snapshot(nodes, pods))


def place_shared_gang(
    snapshot: ClusterSnapshot, request: GangRequest, active_requests: Iterable[SharedShape] = ()
) -> SharedPlacement | SharedRefusal:
    """A shared-GPU gang (`request.shared_mib` per worker) on the snapshot, all or nothing.

    Nodes are those that offer shared GPUs and whose filters take the worker's pod
    (taints, selectors, CPU, memory, trainwave.io/gpu-memory...); how many workers
    each takes is its slot count, which GPU each gets is the packer's choice.
    """
    mib = request.shared_mib or 0
    slots = snapshot.slots(request.needs)
    matching = snapshot.matching(request.node_selector)
    offered = [n for n, ok in zip(snapshot.nodes, matching, strict=True) if ok and n.shared]
    if not offered:
        return SharedRefusal(NO_SHARED_GPUS, "no node the job may use offers shared GPUs")
    largest = max(g.memory_mib for n in offered for g in n.shared)
    if mib > largest:
        return SharedRefusal(
            LARGER_THAN_ANY_GPU,
            f"asks {mib} MiB of one GPU; the largest shared GPU has {largest} MiB",
        )
    room = {
        node.name: count
        for node, count, ok in zip(snapshot.nodes, slots, matching, strict=True)
        if ok and count > 0 and node.shared
    }
    if not room:
        why = [(_closed_reason(n) or check(request.needs, n)) for n in offered]
        nodes = describe(len(offered), why, "a worker (of the nodes with shared GPUs)")
        names = {n.name for n in offered}
        gpus = most_free(n for n in shared_nodes(snapshot) if n.name in names)
        return SharedRefusal(
            NOT_ENOUGH_GPU_MEMORY, f"no node can take a worker now: {nodes}; {gpus}"
        )
    candidates = [n for n in shared_nodes(snapshot) if n.name in room]
    result = place_shared(
        candidates, request.workers, mib, None, active_requests, slots=room, pod=request.needs
    )
    if isinstance(result, SharedRefusal):
        if result.code == LARGER_THAN_ANY_GPU:  # only the busy subset was too small
            return SharedRefusal(NOT_ENOUGH_GPU_MEMORY, result.reason)
        return result
    return SharedPlacement(request.name, result)


def most_free(nodes: Iterable[SharedNode]) -> str:
    """Which shared GPU has the most room, so a wait names the GPU that decides it."""
    found = [(g.free_mib, g.uuid, n.name) for n in nodes for g in n.gpus]
    if not found:
        return "no shared GPU is known"
    most, gpu, node = max(found)
    return f"the most free on any shared GPU is {most} MiB (GPU {gpu} on node {node})"


def _closed_reason(node: NodeInfo) -> tuple[Rejection, ...]:
    if node.schedulable:
        return ()
    if node.closed_why:
        return (Rejection("Marked", node.closed_why),)
    return (Rejection("Held", "held for an earlier gang"),)
