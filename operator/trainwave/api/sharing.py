"""The `gpuSharing` block of a TrainingJob: part of one shared GPU per worker. Pure."""

import math
from dataclasses import dataclass
from decimal import Decimal
from typing import Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from trainwave.api.base import ApiModel, Quantity, cel, validations
from trainwave.api.quantity import ACCEPTED, BadQuantity, parse_quantity
from trainwave.api.runtime import RuntimeSpec

MIB = 1024**2


def memory_bytes(value: int | str) -> int:
    """A memory quantity ('20Gi', '500M', 1073741824) in bytes, a fraction rounded up as the
    API server's Value() does; ValueError says what is accepted."""
    try:
        amount: Decimal | None = parse_quantity(value)
    except BadQuantity:
        amount = None
    if amount is None or amount < 0:
        raise ValueError(f"{value!r} is not a memory quantity; accepted: {ACCEPTED}")
    return math.ceil(amount)


class ModelDescription(ApiModel):
    """Enough about the model for trainwave to estimate its memory (`trainwave size`)."""

    preset: Literal["gpt2-124m", "llama-7b", "bert-base"] | None = Field(
        default=None, description="preset: a named architecture."
    )
    parameters: int | None = Field(
        default=None,
        ge=1,
        description="parameters: the parameter count, when no preset fits (activations are "
        "then not counted: give memory instead if they matter).",
    )
    precision: Literal["fp32", "bf16-mixed", "fp16-mixed", "bf16"] = Field(
        default="bf16-mixed", description="precision: of weights, gradients and activations."
    )
    optimizer: Literal["sgd", "sgd-momentum", "adagrad", "lion", "adam", "adamw"] = Field(
        default="adamw", description="optimizer: decides the optimizer state per parameter."
    )
    micro_batch: int = Field(default=1, ge=1, description="microBatch: samples per step.")
    sequence: int = Field(default=0, ge=0, description="sequence: tokens per sample.")
    checkpointing: Literal["off", "selective", "full"] = Field(
        default="off", description="checkpointing: activation recomputation."
    )


class GpuSharingSpec(ApiModel):
    model_config = ConfigDict(
        **ApiModel.model_config,
        json_schema_extra=validations(
            cel(
                "has(self.memory) != has(self.model)",
                "spec.gpuSharing needs exactly one of memory (e.g. 20Gi) or model (trainwave "
                "estimates the memory from it)",
            ),
            cel(
                "!has(self.model) || has(self.model.preset) != has(self.model.parameters)",
                "spec.gpuSharing.model needs exactly one of preset or parameters",
                ".model",
            ),
        ),
    )

    memory: Quantity | None = Field(
        default=None,
        description="memory: GPU memory each worker needs on one shared GPU, e.g. 20Gi. "
        "The worker is pinned to a GPU with that much free, and its runtime keeps it within "
        "the budget.",
    )
    model: ModelDescription | None = Field(
        default=None,
        description="model: estimate the memory from the model instead (weights, gradients, "
        "optimizer state, activations, and a stated overhead).",
    )
    allow_multiple_workers: bool = Field(
        default=False,
        description="allowMultipleWorkers: let a job of several workers run on shared GPUs. "
        "Off by default: the slowest sharer sets the pace of a whole gang.",
    )

    @field_validator("memory")
    @classmethod
    def _at_least_one_mib(cls, value: int | str | None) -> int | str | None:
        if value is not None and memory_bytes(value) < MIB:
            raise ValueError(f"{value!r} is less than 1Mi")
        return value

    @model_validator(mode="after")
    def _one_source(self) -> "GpuSharingSpec":
        if (self.memory is None) == (self.model is None):
            raise ValueError("needs exactly one of memory (e.g. 20Gi) or model")
        if self.model is not None and (self.model.preset is None) == (
            self.model.parameters is None
        ):
            raise ValueError("model needs exactly one of preset or parameters")
        return self


@dataclass(frozen=True)
class SharedSetup:
    """What the operator configures for one shared worker. The pod is built from it
    (builders/sharing.py) and status.isolation is written from it, so the status can
    claim nothing the pod does not carry."""

    memory_mib: int
    budget_bytes: int
    # The runtime's submodel mode when the runtime is injected, else "off": with
    # "auto" or "on", prepare() caps the allocator and may train through the
    # submodel executor; without the runtime nothing reads the budget.
    allocator: str
    # Host directory of the node-local arbiter's sockets, mounted into the worker;
    # None when the operator runs no arbiter or nothing in the worker would use it.
    arbiter_dir: str | None = None
    # The worker's GPU is a DRA ResourceClaim that kube-scheduler allocates on the
    # GPU the packer chose, accounting that GPU's memory claim by claim.
    gpu_claim: bool = False


def shared_setup(
    memory_mib: int,
    budget_bytes: int,
    runtime: RuntimeSpec | None,
    arbiter_dir: str | None,
    *,
    gpu_claim: bool = False,
) -> SharedSetup:
    allocator = "off"
    if runtime is not None and runtime.enabled:
        allocator = runtime.features.submodel
    return SharedSetup(
        memory_mib=memory_mib,
        budget_bytes=budget_bytes,
        allocator=allocator,
        arbiter_dir=arbiter_dir if allocator != "off" else None,
        gpu_claim=gpu_claim,
    )


def isolation(setup: SharedSetup | None) -> str:
    """What keeps a shared-GPU job apart from its neighbours: what is configured, no more."""
    if setup is None:
        return ""
    budget = f"{setup.memory_mib} MiB"
    accounting = (
        f"per-GPU accounting: a DRA ResourceClaim takes {budget} of the placed GPU's "
        "memory capacity, allocated by kube-scheduler, which refuses a GPU without that much left"
        if setup.gpu_claim
        else "no per-GPU device allocation: Kubernetes accounts trainwave.io/gpu-memory per node"
    )
    parts = [
        # Env pinning is always configured for a shared worker (builders/sharing.py).
        "GPU: pinned by env (NVIDIA_VISIBLE_DEVICES and CUDA_VISIBLE_DEVICES = the placed GPU's "
        "UUID, from the pod's trainwave.io/gpu-uuid annotation); the container sees one GPU "
        f"where the NVIDIA container runtime honours NVIDIA_VISIBLE_DEVICES; {accounting}",
    ]
    if setup.allocator == "off":
        parts.append(
            f"memory: the {budget} budget is advertised (TRAINWAVE_GPU_MEMORY_BUDGET_BYTES), "
            "not enforced: enable spec.runtime with features.submodel auto or on to enforce it"
        )
    else:
        through = (
            "always trains through the submodel allocator"
            if setup.allocator == "on"
            else "trains through the submodel allocator when the model's measured peak exceeds it"
        )
        parts.append(
            f"memory: the runtime's prepare() holds the job to {budget} (caps the CUDA caching "
            f"allocator, {through}; scripts that do not call prepare() are not held)"
        )
    if setup.arbiter_dir is not None:
        parts.append(
            "turns: the node's arbiter grants GPU memory between the jobs on this GPU and "
            "reclaims a dead worker's grant"
        )
    else:
        parts.append("turns: no arbiter between the jobs on this GPU")
    parts.append(
        "no hardware partition (not MIG, not MPS): a GPU fault or a kernel that hogs the GPU "
        "affects every job on it"
    )
    return "soft; " + "; ".join(parts)
