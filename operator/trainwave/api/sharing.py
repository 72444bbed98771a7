"""The `gpuSharing` block of a TrainingJob: part of one shared GPU per worker. Pure."""

import re

from pydantic import Field, field_validator

from trainwave.api.base import ApiModel, Quantity
from trainwave.api.runtime import RuntimeSpec

_MEMORY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|k|K|M|G|T)?$")
_FACTORS = {
    None: 1, "k": 1000, "K": 1000, "M": 1000**2, "G": 1000**3, "T": 1000**4,
    "Ki": 1024, "Mi": 1024**2, "Gi": 1024**3, "Ti": 1024**4,
}  # fmt: skip
MIB = 1024**2


def memory_bytes(value: int | str) -> int:
    """A memory quantity ('20Gi', '500M', 1073741824) in bytes; ValueError says what is accepted."""
    match = _MEMORY.match(str(value).strip())
    if match is None:
        raise ValueError(
            f"{value!r} is not a memory quantity; accepted: a number of bytes or one with a "
            "suffix Ki, Mi, Gi, Ti, K, M, G, T (e.g. 20Gi)"
        )
    number, suffix = match.groups()
    return int(float(number) * _FACTORS[suffix])


class GpuSharingSpec(ApiModel):
    memory: Quantity = Field(
        description="memory: GPU memory each worker needs on one shared GPU, e.g. 20Gi. "
        "The worker is pinned to a GPU with that much free, and its runtime keeps it within "
        "the budget.",
    )
    allow_multiple_workers: bool = Field(
        default=False,
        description="allowMultipleWorkers: let a job of several workers run on shared GPUs. "
        "Off by default: the slowest sharer sets the pace of a whole gang.",
    )

    @field_validator("memory")
    @classmethod
    def _at_least_one_mib(cls, value: int | str) -> int | str:
        if memory_bytes(value) < MIB:
            raise ValueError(f"{value!r} is less than 1Mi")
        return value

    @property
    def memory_bytes(self) -> int:
        return memory_bytes(self.memory)

    @property
    def memory_mib(self) -> int:
        """Rounded up: the extended resource counts whole MiB."""
        return -(-self.memory_bytes // MIB)


def isolation(sharing: GpuSharingSpec | None, runtime: RuntimeSpec | None) -> str:
    """What keeps a shared-GPU job apart from its neighbours, said plainly."""
    if sharing is None:
        return ""
    enforced = (
        runtime is not None and runtime.enabled and runtime.features.submodel in ("on", "auto")
    )
    budget = f"{sharing.memory_mib} MiB"
    memory = (
        f"the runtime's submodel allocator keeps device memory within {budget}"
        if enforced
        else f"the {budget} budget is advertised to the worker (TRAINWAVE_GPU_MEMORY_BUDGET_BYTES) "
        "but not enforced: enable spec.runtime with features.submodel to enforce it"
    )
    return (
        "soft: pinned to one GPU by CUDA_VISIBLE_DEVICES; "
        f"{memory}; no hardware partition (not MIG, not MPS): a GPU fault or a kernel that "
        "hogs the GPU affects every job on it"
    )
