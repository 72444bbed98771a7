"""A shared-GPU job's memory request: as the user gave it, or estimated from its model. Pure.

The operator uses this for the pod's trainwave.io/gpu-memory request, the
worker's budget and the placer, so `trainwave size` and the operator can never
disagree about a model.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainwave.api.sharing import MIB, GpuSharingSpec, ModelDescription, memory_bytes
from trainwave.sizing.errors import SizingError
from trainwave.sizing.memory import estimate_memory
from trainwave.sizing.recommend import SHARE_GRANULE
from trainwave.sizing.setup import TrainingSetup
from trainwave.sizing.shapes import Model, ParameterCount, preset


@dataclass(frozen=True)
class SharedMemory:
    bytes: int
    how: str  # "as asked" or the estimate's breakdown, for messages

    @property
    def mib(self) -> int:
        """Rounded up: the extended resource counts whole MiB."""
        return -(-self.bytes // MIB)


def shared_memory(sharing: GpuSharingSpec) -> SharedMemory:
    """Raises ValueError naming spec.gpuSharing.model's field when the model cannot be sized."""
    if sharing.memory is not None:
        return SharedMemory(
            memory_bytes(sharing.memory), f"spec.gpuSharing.memory {sharing.memory}"
        )
    assert sharing.model is not None  # the model validator allows nothing else
    description = sharing.model
    try:
        estimate = estimate_memory(_model(description), _setup(description))
    except SizingError as error:
        raise ValueError(f"spec.gpuSharing.model.{error}") from None
    # Rounded up as `trainwave size` rounds its shared request, so both say the same.
    request = -(-estimate.total // SHARE_GRANULE) * SHARE_GRANULE
    parts = (
        f"weights {estimate.weights // MIB} MiB, gradients {estimate.gradients // MIB} MiB, "
        f"optimizer {estimate.optimizer // MIB} MiB, activations {estimate.activations // MIB} "
        f"MiB, overhead {estimate.overhead // MIB} MiB"
    )
    return SharedMemory(
        request, f"estimated from spec.gpuSharing.model ({parts}; rounded up to 256 MiB)"
    )


def _model(description: ModelDescription) -> Model:
    if description.preset is not None:
        return preset(description.preset)
    assert description.parameters is not None
    return ParameterCount(description.parameters)


def _setup(description: ModelDescription) -> TrainingSetup:
    return TrainingSetup(
        precision=description.precision,
        optimizer=description.optimizer,
        micro_batch=description.micro_batch,
        sequence=description.sequence,
        checkpointing=description.checkpointing,
    )
