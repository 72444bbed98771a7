"""Whole GPUs or a share of one, and how many, for a given GPU memory size and speed.

Pure. Two bounds decide. Memory: a job whose per-GPU estimate fits in half a
GPU may share. Compute (compute.py): a job may share only if its step keeps a
GPU busy at most half of the time; a compute-heavy step takes whole GPUs even
when its memory is small, since co-located jobs that each keep a GPU busy only
slow each other down. A light job that passes both asks for its memory,
rounded up to 256 MiB, and as many such jobs fit one GPU as both bounds allow
(at least two). A job that fits one GPU otherwise takes whole GPUs, as many as
its setup asks for. A job that fits no GPU as configured gets the smallest GPU count that
fits, trying in this order what costs least: ZeRO stages up to 3, full
activation checkpointing, tensor parallelism (powers of two up to 8, dividing
the heads), then more data parallelism (which also grows the global batch).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import product

from trainwave.sizing.compute import DEFAULT_GPU_TFLOPS, ComputeEstimate, estimate_compute
from trainwave.sizing.errors import SizingError
from trainwave.sizing.flops import step_flops
from trainwave.sizing.memory import MemoryEstimate, estimate_memory
from trainwave.sizing.setup import MiB, TrainingSetup
from trainwave.sizing.shapes import Model, TransformerShape

SHARE_GRANULE = 256 * MiB
MAX_DATA_PARALLEL = 4096


@dataclass(frozen=True)
class Recommendation:
    """`mode` is shared, whole or none. For shared, `memory_request` is each
    worker's GPU-memory request and `jobs_per_gpu` how many such fit one GPU.
    `compute`: how busy the recommended setup keeps a GPU (None when none fits)."""

    mode: str
    gpus: int
    memory_request: int
    jobs_per_gpu: int
    setup: TrainingSetup
    estimate: MemoryEstimate
    reason: str
    compute: ComputeEstimate | None = None


def recommend(
    model: Model,
    setup: TrainingSetup,
    gpu_memory: int,
    gpu_tflops: float = DEFAULT_GPU_TFLOPS,
) -> Recommendation:
    """`gpu_memory` in bytes; `gpu_tflops` the GPU's peak dense 16-bit TFLOP/s."""
    if gpu_memory < SHARE_GRANULE:
        raise SizingError("gpu_memory", gpu_memory, f"at least {SHARE_GRANULE} bytes (256 MiB)")
    estimate = estimate_memory(model, setup)
    need = estimate.total
    if need <= gpu_memory:
        compute = estimate_compute(model, setup, step_flops(model, setup), gpu_tflops)
        return _fits_one_gpu(setup, estimate, compute, gpu_memory)
    fitting = smallest_fitting(model, setup, gpu_memory)
    if fitting is None:
        return Recommendation(
            mode="none",
            gpus=0,
            memory_request=0,
            jobs_per_gpu=0,
            setup=setup,
            estimate=estimate,
            reason=(
                f"needs {gib(need)} per GPU; no setup up to tensor parallel 8 x data parallel "
                f"{MAX_DATA_PARALLEL} with ZeRO-3 and checkpointing fits {gib(gpu_memory)}"
            ),
        )
    better, better_estimate = fitting
    compute = estimate_compute(model, better, step_flops(model, better), gpu_tflops)
    return Recommendation(
        mode="whole",
        gpus=better.gpus,
        memory_request=gpu_memory,
        jobs_per_gpu=1,
        setup=better,
        estimate=better_estimate,
        reason=(
            f"needs {gib(need)} per GPU as configured, more than {gib(gpu_memory)}; "
            f"{describe_changes(setup, better)} brings it to {gib(better_estimate.total)}"
        ),
        compute=compute,
    )


def _fits_one_gpu(
    setup: TrainingSetup, estimate: MemoryEstimate, compute: ComputeEstimate, gpu_memory: int
) -> Recommendation:
    """Shared only when both bounds allow it; the reason names the bound that decided."""
    need = estimate.total
    memory_light = 2 * need <= gpu_memory
    if memory_light and compute.light:
        request = -(-need // SHARE_GRANULE) * SHARE_GRANULE
        by_memory, by_compute = gpu_memory // request, compute.jobs_per_gpu
        fit = min(by_memory, by_compute)
        bound = "memory" if by_memory <= by_compute else "compute"
        return Recommendation(
            mode="shared",
            gpus=setup.gpus,
            memory_request=request,
            jobs_per_gpu=fit,
            setup=setup,
            estimate=estimate,
            reason=(
                f"needs {gib(need)} per GPU, at most half of {gib(gpu_memory)}, and "
                f"{compute.describe()}, at most half: share a GPU; {bound} bounds it to "
                f"{fit} such jobs per GPU"
            ),
            compute=compute,
        )
    if memory_light:
        reason = (
            f"compute decided: it needs only {gib(need)} per GPU of {gib(gpu_memory)}, but "
            f"{compute.describe()}; jobs sharing a GPU would slow each other down: whole GPUs"
        )
    else:
        reason = f"memory decided: needs {gib(need)} per GPU of {gib(gpu_memory)}: whole GPUs"
    return Recommendation(
        mode="whole",
        gpus=setup.gpus,
        memory_request=gpu_memory,
        jobs_per_gpu=1,
        setup=setup,
        estimate=estimate,
        reason=reason,
        compute=compute,
    )


def smallest_fitting(
    model: Model, setup: TrainingSetup, gpu_memory: int
) -> tuple[TrainingSetup, MemoryEstimate] | None:
    tensor = [1]
    if isinstance(model, TransformerShape):
        tensor = [t for t in (1, 2, 4, 8) if model.heads % t == 0 and t >= setup.tensor_parallel]
    data = [setup.data_parallel]
    while data[-1] < MAX_DATA_PARALLEL:
        data.append(data[-1] * 2)
    checkpointing = [setup.checkpointing] + (["full"] if setup.checkpointing != "full" else [])
    zero = range(setup.zero_stage, 4)
    best: tuple[tuple[int, int], TrainingSetup, MemoryEstimate] | None = None
    for cost, (t, d, ckpt, z) in enumerate(product(tensor, data, checkpointing, zero)):
        candidate = replace(
            setup, tensor_parallel=t, data_parallel=d, checkpointing=ckpt, zero_stage=z
        )
        estimate = estimate_memory(model, candidate)
        key = (candidate.gpus, cost)
        if estimate.total <= gpu_memory and (best is None or key < best[0]):
            best = (key, candidate, estimate)
    return None if best is None else (best[1], best[2])


def describe_changes(before: TrainingSetup, after: TrainingSetup) -> str:
    changes = []
    if after.zero_stage != before.zero_stage:
        changes.append(f"ZeRO stage {after.zero_stage}")
    if after.checkpointing != before.checkpointing:
        changes.append(f"{after.checkpointing} activation checkpointing")
    if after.tensor_parallel != before.tensor_parallel:
        changes.append(f"tensor parallel {after.tensor_parallel}")
    if after.data_parallel != before.data_parallel:
        changes.append(f"data parallel {after.data_parallel}")
    return " + ".join(changes)


def gib(n: int) -> str:
    if n < 1 << 30:
        return f"{n / (1 << 20):.1f} MiB"
    return f"{n / (1 << 30):.2f} GiB"
