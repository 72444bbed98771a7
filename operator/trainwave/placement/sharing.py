"""Shared GPUs: which GPU of which node each worker of a shared-GPU job gets. Pure.

Algorithm overview
------------------
Nodes offer some GPUs for sharing (the node agent lists them, with UUID and
memory, in its inventory annotation, and advertises their memory as the
extended resource trainwave.io/gpu-memory so kube-scheduler accounts for it
per node). Per GPU, the free memory is its size minus the requests of the
pods pinned to it (bound, or released and not bound yet). A worker asks for
memory on one GPU; memory is turned into the fraction of that GPU (milli-GPU,
rounded up) and the packing policy (packing.py: FGD's fragmentation gradient
with trainwave's tie-break) picks the node and GPU. Workers of one job are
placed one after another on a working copy; if one does not fit, none is
placed (all or nothing) and the answer says why in numbers.

Invariants: a GPU never gets more than its memory; only shared GPUs are used;
a node's whole-GPU capacity is untouched (shared GPUs are the agent's choice).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from trainwave.contract import (
    ANNOTATION_GPU_UUID,
    NODE_LABEL_GPU_PRODUCT,
    SHARED_GPU_MEMORY_RESOURCE,
)
from trainwave.placement.fragmentation import MILLI, FragmentationMeasure, Shape, typical_shapes
from trainwave.placement.packing import NodeState, Task, Trainwave, assign, choose
from trainwave.placement.snapshot import (
    DEFAULT_TOLERATED_TAINTS,
    node_schedulable,
    read_inventory,
)

# Enough CPU and memory that only GPU memory decides: kube-scheduler checks the rest.
_UNCONSTRAINED = 1 << 40
# What the fragmentation measure assumes arrives when nothing is running yet:
# quarter, half and whole GPUs, the usual sizes of notebooks, fine-tunes and sweeps.
DEFAULT_SHAPES = (250, 500, 1000)


@dataclass(frozen=True)
class SharedGpu:
    uuid: str
    index: int
    memory_mib: int
    used_mib: int = 0

    @property
    def free_mib(self) -> int:
        return max(0, self.memory_mib - self.used_mib)


@dataclass(frozen=True)
class SharedNode:
    name: str
    gpu_model: str
    gpus: tuple[SharedGpu, ...]
    schedulable: bool = True
    labels: Mapping[str, str] | None = None


@dataclass(frozen=True)
class Pin:
    node: str
    gpu_uuid: str
    memory_mib: int


@dataclass(frozen=True)
class SharedRefusal:
    code: str
    reason: str


NO_SHARED_GPUS = "NoSharedGPUs"
NOT_ENOUGH_GPU_MEMORY = "NotEnoughGPUMemory"
# More than any shared GPU of the cluster has in all: waiting cannot help.
LARGER_THAN_ANY_GPU = "LargerThanAnyGPU"


def place_shared(
    nodes: Iterable[SharedNode],
    workers: int,
    memory_mib: int,
    selector: Mapping[str, str] | None = None,
    active_requests: Iterable[int] = (),
) -> tuple[Pin, ...] | SharedRefusal:
    """Pin each of `workers` to a shared GPU with `memory_mib` free, or say why not."""
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
    policy = Trainwave(measure(usable, memory_mib, active_requests))
    states = {n.name: _state(n) for n in usable}
    by_name = {n.name: n for n in usable}
    pins: list[Pin] = []
    for _ in range(workers):
        task = Task(0, 0, num_gpu=1, gpu_milli=_milli(memory_mib, _gpu_memory(by_name)))
        choice = _choose_fitting(policy, states, by_name, task, memory_mib)
        if choice is None:
            most = max(g.free_mib for n in by_name.values() for g in n.gpus)
            placed = f"; {len(pins)} of {workers} workers would fit" if workers > 1 else ""
            return SharedRefusal(
                NOT_ENOUGH_GPU_MEMORY,
                f"needs {memory_mib} MiB on one GPU per worker; the most free on any shared "
                f"GPU is {most} MiB{placed}",
            )
        node_name, gpu_index = choice
        node = by_name[node_name]
        gpu = next(g for g in node.gpus if g.index == gpu_index)
        pins.append(Pin(node_name, gpu.uuid, memory_mib))
        by_name[node_name] = _with_used(node, gpu_index, memory_mib)
        states[node_name] = assign(states[node_name], task, (_position(node, gpu_index),))
    return tuple(pins)


def measure(
    nodes: list[SharedNode], memory_mib: int, active_requests: Iterable[int]
) -> FragmentationMeasure:
    """The fragmentation measure over the shapes this cluster sees: what runs, plus defaults."""
    size = _gpu_memory({n.name: n for n in nodes})
    millis = [_milli(m, size) for m in (*active_requests, memory_mib)] + list(DEFAULT_SHAPES)
    shapes = [Shape(0, milli, 1, "") for milli in millis]
    return FragmentationMeasure(typical_shapes(shapes, coverage=1.0))


def _choose_fitting(
    policy: Trainwave,
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
        _UNCONSTRAINED,
        _UNCONSTRAINED,
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


def _milli(memory_mib: int, gpu_mib: int) -> int:
    return min(MILLI, max(1, math.ceil(memory_mib * MILLI / gpu_mib)))


def build_shared_nodes(
    nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]]
) -> list[SharedNode]:
    """Shared GPUs per node from raw Nodes (the agent's inventory) and the pods pinned to them."""
    used: dict[str, int] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        uuid = (meta.get("annotations") or {}).get(ANNOTATION_GPU_UUID)
        phase = (pod.get("status") or {}).get("phase")
        if uuid and phase not in ("Succeeded", "Failed"):
            used[uuid] = used.get(uuid, 0) + requested_mib(pod)
    shared = []
    for node in nodes:
        meta = node.get("metadata") or {}
        gpus = _inventory_gpus(node)
        if not gpus:
            continue
        labels = dict(meta.get("labels") or {})
        shared.append(
            SharedNode(
                name=meta["name"],
                gpu_model=labels.get(NODE_LABEL_GPU_PRODUCT, ""),
                gpus=tuple(replace(g, used_mib=used.get(g.uuid, 0)) for g in gpus),
                schedulable=node_schedulable(node, DEFAULT_TOLERATED_TAINTS),
                labels=labels,
            )
        )
    return shared


def with_pins(node: SharedNode, pins: Iterable[Pin]) -> SharedNode:
    """`node` with the memory of the pins on its GPUs counted as used."""
    for pin in pins:
        if pin.node == node.name:
            index = next(g.index for g in node.gpus if g.uuid == pin.gpu_uuid)
            node = _with_used(node, index, pin.memory_mib)
    return node


def _inventory_gpus(node: Mapping[str, Any]) -> tuple[SharedGpu, ...]:
    inventory = read_inventory(node)
    try:
        listed = (inventory or {}).get("sharedGpus") or []
        return tuple(
            SharedGpu(str(g["uuid"]), int(g["index"]), int(g["memoryMiB"])) for g in listed
        )
    except (KeyError, TypeError, ValueError):
        return ()  # an unreadable inventory offers nothing; the agent rewrites it


def requested_mib(pod: Mapping[str, Any]) -> int:
    """The pod's trainwave.io/gpu-memory request, summed over its containers."""
    total = 0
    for container in (pod.get("spec") or {}).get("containers") or ():
        limits = (container.get("resources") or {}).get("limits") or {}
        value = limits.get(SHARED_GPU_MEMORY_RESOURCE)
        if value is not None:
            try:
                total += int(str(value))
            except ValueError:
                continue
    return total
