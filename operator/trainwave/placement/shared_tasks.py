"""Shared-GPU workers and nodes as the packer sees them: GPU share, CPU and memory. Pure.

A shared worker is one packing `Task`: the milli-GPU of its GPU-memory request plus
the CPU and memory its pod requests as kube-scheduler counts them (`PodNeeds`, read
by requirements.pod_requests, component-helpers `resource.PodRequests`: containers
summed, the init-container peak with the sidecars before it, pod-level requests,
pod overhead). A node is one `NodeState`: the free milli-GPU of each shared GPU,
and CPU and memory allocatable minus requested (filters.free_amount, the numbers
NodeResourcesFit compares). Memory stays in bytes on both sides, so the packer
refuses exactly the nodes the CPU and memory filters refuse, and its fragmentation
measure sees the CPU a node would have left: GPU memory next to exhausted CPU is
idle memory no typical worker can use.

The typical shapes the measure weighs (FGD's "next task" distribution) are the
shared workers running now, each with its GPU memory and CPU, the worker being
placed, and the default quarter, half and whole GPU (asking no CPU: nothing is
known of them).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import NamedTuple

from trainwave.placement.filters import free_amount
from trainwave.placement.fragmentation import MILLI, FragmentationMeasure, Shape, typical_shapes
from trainwave.placement.packing import Task
from trainwave.placement.quantities import CPU, MEMORY
from trainwave.placement.requirements import PodNeeds
from trainwave.placement.snapshot import NodeInfo

# CPU or memory a caller does not track (placement by GPU memory alone, in tests).
UNTRACKED = 1 << 62
# What the fragmentation measure assumes arrives when nothing is running yet:
# quarter, half and whole GPUs, the usual sizes of notebooks, fine-tunes and sweeps.
DEFAULT_SHAPES = (250, 500, 1000)


class SharedShape(NamedTuple):
    """One shared worker's shape: MiB of one GPU, and its pod's CPU request."""

    mib: int
    cpu_milli: int = 0


def pinned_shape(gpu_mib: int, requests: Iterable[tuple[str, int]]) -> SharedShape:
    """The shape of a pod pinned to a shared GPU, from its requests (PodRecord.requests)."""
    return SharedShape(gpu_mib, dict(requests).get(CPU, 0))


def gpu_milli(memory_mib: int, gpu_mib: int) -> int:
    """MiB of a GPU of `gpu_mib` as milli-GPU, rounded up (at least 1, at most a GPU)."""
    return min(MILLI, max(1, math.ceil(memory_mib * MILLI / gpu_mib)))


def worker_task(pod: PodNeeds | None, milli: int) -> Task:
    """The packing task of one shared worker: `milli` of one GPU, the pod's CPU and memory."""
    if pod is None:
        return Task(0, 0, num_gpu=1, gpu_milli=milli)
    return Task(pod.amount(CPU), pod.amount(MEMORY), num_gpu=1, gpu_milli=milli)


def free_cpu_memory(node: NodeInfo) -> tuple[int, int]:
    """(CPU millicores, memory bytes) free on `node`, as NodeResourcesFit counts them.

    Clamped at 0: a node whose pods over-request (static pods) still takes a pod that
    asks for none, as the filter's `wanted > 0 and wanted > free` lets it."""
    return max(0, free_amount(node, CPU)), max(0, free_amount(node, MEMORY))


def typical_measure(gpu_mib: int, shapes: Iterable[SharedShape]) -> FragmentationMeasure:
    """FGD's measure over `shapes` plus the defaults, milli-GPU against `gpu_mib`."""
    typical = [Shape(s.cpu_milli, gpu_milli(s.mib, gpu_mib), 1, "") for s in shapes]
    typical += [Shape(0, milli, 1, "") for milli in DEFAULT_SHAPES]
    return FragmentationMeasure(typical_shapes(typical, coverage=1.0))
