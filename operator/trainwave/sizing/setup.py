"""How a model is trained: precision, optimizer, batch, recomputation, parallelism.

Pure. The tables below are the bytes each choice costs per parameter; the
estimate in `memory.py` multiplies them out.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainwave.sizing.errors import SizingError, require_positive

GiB = 1 << 30
MiB = 1 << 20


@dataclass(frozen=True)
class PrecisionBytes:
    """Bytes per parameter for the working weights, their gradients and the fp32
    master copy, bytes per optimizer-state element, and per activation element."""

    weight: int
    gradient: int
    master: int
    state: int
    activation: int


# Mixed precision follows Megatron/DeepSpeed (Rajbhandari et al. 2020, ZeRO §3):
# 16-bit weights and gradients plus an fp32 master copy, counted with the
# optimizer state because ZeRO shards it with that state. torch.autocast keeps
# fp32 weights and gradients instead (4 + 4, no master): the same 8 bytes per
# parameter before the optimizer, split differently. "bf16" is pure bf16
# training: no master copy, optimizer state in bf16 too.
PRECISIONS: dict[str, PrecisionBytes] = {
    "fp32": PrecisionBytes(weight=4, gradient=4, master=0, state=4, activation=4),
    "bf16-mixed": PrecisionBytes(weight=2, gradient=2, master=4, state=4, activation=2),
    "fp16-mixed": PrecisionBytes(weight=2, gradient=2, master=4, state=4, activation=2),
    "bf16": PrecisionBytes(weight=2, gradient=2, master=0, state=2, activation=2),
}

# State elements each optimizer keeps per parameter.
OPTIMIZER_STATES: dict[str, int] = {
    "sgd": 0,
    "sgd-momentum": 1,  # momentum buffer
    "adagrad": 1,  # sum of squares
    "lion": 1,  # one momentum
    "adam": 2,  # first and second moment
    "adamw": 2,
}

# off: keep every activation. selective: recompute attention scores only
# (Korthikanti et al. 2022, §4.2). full: keep each block's input, recompute the
# block in backward.
CHECKPOINTING = ("off", "selective", "full")


@dataclass(frozen=True)
class TrainingSetup:
    """One training step on one model replica; `sequence` is tokens per sample
    (0: a transformer's position count, ignored for MLPs)."""

    precision: str = "bf16-mixed"
    optimizer: str = "adamw"
    micro_batch: int = 1
    sequence: int = 0
    checkpointing: str = "off"
    data_parallel: int = 1
    tensor_parallel: int = 1
    sequence_parallel: bool = False
    zero_stage: int = 0
    # CUDA context, cuBLAS/cuDNN workspaces and NCCL buffers are outside what
    # the formulas count; the caching allocator's fragmentation grows with the
    # rest. 512 MiB plus 10% is the stated allowance, not a measurement.
    overhead_bytes: int = 512 * MiB
    overhead_fraction: float = 0.10

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise SizingError("precision", self.precision, f"one of {', '.join(PRECISIONS)}")
        if self.optimizer not in OPTIMIZER_STATES:
            raise SizingError("optimizer", self.optimizer, f"one of {', '.join(OPTIMIZER_STATES)}")
        if self.checkpointing not in CHECKPOINTING:
            raise SizingError(
                "checkpointing", self.checkpointing, f"one of {', '.join(CHECKPOINTING)}"
            )
        for name in ("micro_batch", "data_parallel", "tensor_parallel"):
            require_positive(name, getattr(self, name))
        if self.sequence < 0:
            raise SizingError("sequence", self.sequence, "an integer >= 0")
        if self.zero_stage not in (0, 1, 2, 3):
            raise SizingError("zero_stage", self.zero_stage, "0, 1, 2 or 3")
        if self.overhead_bytes < 0:
            raise SizingError("overhead_bytes", self.overhead_bytes, "an integer >= 0")
        if not 0.0 <= self.overhead_fraction < 1.0:
            raise SizingError("overhead_fraction", self.overhead_fraction, "0 <= x < 1")

    @property
    def bytes(self) -> PrecisionBytes:
        return PRECISIONS[self.precision]

    @property
    def optimizer_states(self) -> int:
        return OPTIMIZER_STATES[self.optimizer]

    @property
    def gpus(self) -> int:
        return self.data_parallel * self.tensor_parallel
