"""FLOPs of one training step (forward + backward) on one micro-batch.

Pure. Model FLOPs are the work the model needs; hardware FLOPs add what
recomputation repeats. For transformers (Kaplan et al. 2020 §2.1; PaLM,
Chowdhery et al. 2022, Appendix B): 6·N·T for the weight matmuls, where N
counts every parameter multiplied per token (blocks and LM head, not lookup
tables) and T = micro_batch x sequence, plus 12·L·h·s·T for the attention
scores and their use on the values. Norms and biases are counted inside 6·N,
a slight overcount. An MLP costs 6·N per sample.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainwave.sizing.memory import sequence_length
from trainwave.sizing.setup import TrainingSetup
from trainwave.sizing.shapes import MLPShape, Model, TransformerShape


@dataclass(frozen=True)
class StepFlops:
    """Per micro-batch on one model replica (all its tensor-parallel GPUs)."""

    tokens: int
    model: int
    hardware: int

    def per_gpu(self, tensor_parallel: int) -> int:
        return self.hardware // tensor_parallel


def step_flops(model: Model, setup: TrainingSetup) -> StepFlops:
    b = setup.micro_batch
    if isinstance(model, MLPShape):
        flops = 6 * model.parameters() * b
        return StepFlops(tokens=b, model=flops, hardware=flops)
    if not isinstance(model, TransformerShape):
        tokens = b * max(1, setup.sequence)
        flops = 6 * model.parameters() * tokens
        return StepFlops(tokens=tokens, model=flops, hardware=flops)
    s = sequence_length(model, setup)
    tokens = b * s
    matmul_params = model.layers * model.block_params() + model.head_params()
    weights = 6 * matmul_params * tokens
    attention = 12 * model.layers * model.hidden * s * tokens
    # The pooler runs once per sequence, not per token.
    pooler = 6 * model.pooler_params() * b
    flops = weights + attention + pooler
    # Recomputation repeats forward work (a third of fwd + bwd): every block's
    # forward for full checkpointing, the attention scores for selective.
    if setup.checkpointing == "full":
        extra = (weights - 6 * model.head_params() * tokens + attention) // 3
    elif setup.checkpointing == "selective":
        extra = attention // 3
    else:
        extra = 0
    return StepFlops(tokens=tokens, model=flops, hardware=flops + extra)
