"""Rank order and parallelism groups: which ranks must sit close together. Pure.

Ranks. Worker rank w runs the processes with global ranks w*G .. w*G+G-1 (G GPUs per
worker, one process per GPU). Placement hands out worker ranks in node-index order of the
topology tree, which is depth-first: consecutive ranks share a node, then an NVLink domain,
then a rack, then a spine, and a job crosses each boundary as few times as the domains it
uses allow.

Parallelism. Global rank r has tensor index r % T, pipeline stage (r // T) % P and data
replica r // (T*P): tensor fastest, then pipeline, then data (Megatron-Core's order
"tp-pp-dp"; the runtime builds its process groups the same way). So a tensor-parallel
group is T consecutive ranks, and a model-parallel group (all stages of one replica) is
T*P consecutive ranks. Placement keeps each tensor group inside one NVLink domain (or one
node) and each model-parallel group inside one domain of the pipeline level (a rack), by
treating them as blocks of consecutive workers that are never split across those domains.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import pairwise

from trainwave.placement.topology import Topology


@dataclass(frozen=True, slots=True)
class Parallelism:
    """Degrees of a job's parallelism; `data` is derived from the world size when None."""

    tensor: int = 1
    pipeline: int = 1
    data: int | None = None


@dataclass(frozen=True, slots=True)
class Blocks:
    """Consecutive workers that must stay together, and the data-parallel degree."""

    tensor_workers: int  # a tensor group's workers: one NVLink domain (1: inside a worker)
    pipeline_workers: int  # a model-parallel group's workers: one rack
    data: int


@dataclass(frozen=True, slots=True)
class Coordinates:
    tensor: int
    pipeline: int
    data: int


def plan_blocks(
    parallelism: Parallelism | None, workers: int, gpus_per_worker: int
) -> Blocks | str:
    """The worker blocks a job's parallelism implies, or why the degrees cannot work."""
    if parallelism is None:
        return Blocks(1, 1, workers * gpus_per_worker)
    tensor, pipeline = parallelism.tensor, parallelism.pipeline
    if tensor < 1 or pipeline < 1 or (parallelism.data is not None and parallelism.data < 1):
        return "parallelism degrees must be at least 1"
    world = workers * gpus_per_worker
    group = tensor * pipeline
    if world % group:
        return (
            f"tensor {tensor} x pipeline {pipeline} = {group} GPUs per model replica "
            f"does not divide the job's {world} GPUs ({workers} workers x {gpus_per_worker})"
        )
    data = world // group
    if parallelism.data is not None and parallelism.data != data:
        return (
            f"tensor {tensor} x pipeline {pipeline} x data {parallelism.data} = "
            f"{group * parallelism.data} GPUs, but the job has {world}"
        )
    for size, what in ((tensor, "a tensor-parallel group"), (group, "a model replica")):
        if size % gpus_per_worker and gpus_per_worker % size:
            return (
                f"{what} spans {size} GPUs, which neither fills whole workers of "
                f"{gpus_per_worker} GPUs nor divides one"
            )
    return Blocks(
        tensor_workers=max(1, tensor // gpus_per_worker),
        pipeline_workers=max(1, group // gpus_per_worker),
        data=data,
    )


def coordinates(rank: int, parallelism: Parallelism) -> Coordinates:
    tensor, pipeline = parallelism.tensor, parallelism.pipeline
    return Coordinates(
        tensor=rank % tensor,
        pipeline=(rank // tensor) % pipeline,
        data=rank // (tensor * pipeline),
    )


def tensor_groups(world: int, parallelism: Parallelism) -> tuple[range, ...]:
    size = parallelism.tensor
    return tuple(range(start, start + size) for start in range(0, world, size))


def model_parallel_groups(world: int, parallelism: Parallelism) -> tuple[range, ...]:
    size = parallelism.tensor * parallelism.pipeline
    return tuple(range(start, start + size) for start in range(0, world, size))


def pipeline_groups(world: int, parallelism: Parallelism) -> tuple[tuple[int, ...], ...]:
    """The ranks of each pipeline: one per (data replica, tensor index), stage by stage."""
    tensor, pipeline = parallelism.tensor, parallelism.pipeline
    return tuple(
        tuple(replica + stage * tensor + index for stage in range(pipeline))
        for replica in range(0, world, tensor * pipeline)
        for index in range(tensor)
    )


def order_workers(topology: Topology, allocation: Iterable[tuple[int, int]]) -> tuple[str, ...]:
    """Worker ranks -> node names from (node index, workers) pairs, neighbours together."""
    names = topology.node_names
    return tuple(names[node] for node, count in sorted(allocation) for _ in range(count))


def neighbour_breaks(topology: Topology, nodes: Sequence[str], level: int) -> int:
    """How many consecutive worker ranks sit in different domains of `level`."""
    index, owners = topology.node_index, topology.node_domains[level]
    domains = [owners[index[name]] for name in nodes]
    return sum(1 for a, b in pairwise(domains) if a != b)
