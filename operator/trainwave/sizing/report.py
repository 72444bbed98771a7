"""Plain-text and JSON renderings of a sizing result, for `trainwave size`."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from trainwave.sizing.flops import StepFlops
from trainwave.sizing.memory import describe_model
from trainwave.sizing.recommend import Recommendation, gib
from trainwave.sizing.shapes import MLPShape, Model


def render_text(model: Model, result: Recommendation, flops: StepFlops) -> str:
    e, s = result.estimate, result.setup
    lines = [
        f"model: {describe_model(model)}, {e.parameters:,} parameters",
        f"setup: {s.precision}, {s.optimizer}, micro-batch {s.micro_batch}, "
        f"checkpointing {s.checkpointing}, data parallel {s.data_parallel}, "
        f"tensor parallel {s.tensor_parallel}, ZeRO {s.zero_stage}",
        "per-GPU memory:",
        f"  weights      {gib(e.weights):>12}",
        f"  gradients    {gib(e.gradients):>12}",
        f"  optimizer    {gib(e.optimizer):>12}",
        f"  activations  {gib(e.activations):>12}",
        f"  overhead     {gib(e.overhead):>12}",
        f"  total        {gib(e.total):>12}",
        f"FLOPs per micro-batch: {flops.model:.3e} model, {flops.hardware:.3e} with "
        f"recomputation, {flops.per_gpu(s.tensor_parallel):.3e} per GPU "
        f"({flops.tokens:,} {'samples' if isinstance(model, MLPShape) else 'tokens'})",
    ]
    if result.compute is not None:
        lines.append(f"GPU busy: {result.compute.describe()}")
    lines += [f"note: {note}" for note in e.notes]
    if result.mode == "shared":
        lines.append(
            f"recommendation: shared GPU, request {gib(result.memory_request)} on each of "
            f"{result.gpus} GPU(s); {result.jobs_per_gpu} such jobs fit one GPU"
        )
    elif result.mode == "whole":
        lines.append(f"recommendation: {result.gpus} whole GPU(s)")
    else:
        lines.append("recommendation: none fits")
    lines.append(f"because: {result.reason}")
    return "\n".join(lines)


def render_json(model: Model, result: Recommendation, flops: StepFlops) -> dict[str, Any]:
    return {
        "model": describe_model(model),
        "parameters": result.estimate.parameters,
        "setup": asdict(result.setup),
        "memory": {**asdict(result.estimate), "total": result.estimate.total},
        "flops": asdict(flops),
        "compute": None
        if result.compute is None
        else {
            **asdict(result.compute),
            "busy": round(result.compute.busy, 4),
            "light": result.compute.light,
        },
        "recommendation": {
            "mode": result.mode,
            "gpus": result.gpus,
            "memoryRequest": result.memory_request,
            "jobsPerGpu": result.jobs_per_gpu,
            "reason": result.reason,
        },
    }
