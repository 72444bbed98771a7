"""Per-GPU memory of one training step: weights, gradients, optimizer, activations.

Pure. Algorithm overview:
- Parameters, gradients and optimizer state cost a fixed number of bytes per
  parameter (setup.PRECISIONS, setup.OPTIMIZER_STATES). Tensor parallelism
  divides all three by its degree (the few replicated norm and bias vectors are
  ignored); ZeRO (Rajbhandari et al. 2020) divides optimizer state (stage >= 1),
  gradients (>= 2) and weights (3) by the data-parallel degree.
- Transformer activations follow Korthikanti et al. 2022, "Reducing Activation
  Recomputation in Large Transformer Models", §4: per block and token
  34·h + 5·a·s bytes with 16-bit activations, dropout, a 4h MLP and no
  parallelism. Here the same terms are kept per tensor so other element sizes,
  SwiGLU MLPs and models without dropout come out right; with its assumptions
  the code reproduces the paper's 34 and 5 exactly (see tests).
- Overhead: setup.overhead_bytes plus setup.overhead_fraction of the rest.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainwave.sizing.errors import SizingError
from trainwave.sizing.setup import TrainingSetup
from trainwave.sizing.shapes import MLPShape, Model, ParameterCount, TransformerShape


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes on each GPU; `notes` says what was assumed or left out."""

    parameters: int
    weights: int
    gradients: int
    optimizer: int
    activations: int
    overhead: int
    notes: tuple[str, ...] = ()

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.optimizer + self.activations + self.overhead


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def estimate_memory(model: Model, setup: TrainingSetup) -> MemoryEstimate:
    check_parallelism(model, setup)
    params = model.parameters()
    local = ceil_div(params, setup.tensor_parallel)
    size = setup.bytes
    d = setup.data_parallel
    weights = local * size.weight
    gradients = local * size.gradient
    optimizer = local * (size.master + setup.optimizer_states * size.state)
    if setup.zero_stage >= 1:
        optimizer = ceil_div(optimizer, d)
    if setup.zero_stage >= 2:
        gradients = ceil_div(gradients, d)
    if setup.zero_stage >= 3:
        weights = ceil_div(weights, d)
    notes: list[str] = []
    if isinstance(model, TransformerShape):
        activations = transformer_activations(model, setup)
    elif isinstance(model, MLPShape):
        activations = mlp_activations(model, setup)
    else:
        activations = 0
        notes.append("activations not estimated: give an architecture shape, not a count")
    counted = weights + gradients + optimizer + activations
    overhead = setup.overhead_bytes + int(counted * setup.overhead_fraction)
    return MemoryEstimate(
        parameters=params,
        weights=weights,
        gradients=gradients,
        optimizer=optimizer,
        activations=activations,
        overhead=overhead,
        notes=tuple(notes),
    )


def check_parallelism(model: Model, setup: TrainingSetup) -> None:
    t = setup.tensor_parallel
    if t == 1:
        return
    if not isinstance(model, TransformerShape):
        raise SizingError(
            "tensor_parallel", t, "1 for a model without a transformer shape (heads to split)"
        )
    if model.heads % t:
        raise SizingError("tensor_parallel", t, f"a divisor of heads ({model.heads})")


def sequence_length(model: TransformerShape, setup: TrainingSetup) -> int:
    s = setup.sequence or model.positions
    if s < 1:
        raise SizingError("sequence", setup.sequence, "tokens per sample >= 1 for a transformer")
    if model.positions and s > model.positions:
        raise SizingError("sequence", s, f"at most the model's positions ({model.positions})")
    return s


def block_activations(model: TransformerShape, setup: TrainingSetup, s: int) -> int:
    """Bytes one block keeps for backward, on one GPU (Korthikanti et al. 2022, §4.1).

    Per token: the inputs of the two norms (2h), of the QKV projection (h) and of
    the MLP (h) stay whole on every tensor-parallel rank (unless sequence
    parallelism splits them too); Q, K, V and the output projection's input (4h)
    and the MLP's inner tensors (2f: up-projection output and activation output;
    SwiGLU: gate, up, activation and product, 4f) are split. Dropout adds a
    1-byte mask after attention and after the MLP. Per head and token pair: the
    softmax output, plus the attention-dropout output and its mask.
    """
    size = setup.bytes.activation
    h, a, f, b = model.hidden, model.heads, model.ffn_width, setup.micro_batch
    t = setup.tensor_parallel
    mask = 1 if model.dropout else 0
    whole = size * 4 * h + mask * 2 * h
    split = size * (4 * h + (4 * f if model.gated_mlp else 2 * f))
    scores = a * s * s * b * (size * (1 + mask) + mask)
    if setup.checkpointing == "selective":
        scores = 0  # recomputed from Q and K in backward
    whole_share = ceil_div(whole, t) if setup.sequence_parallel else whole
    return s * b * (whole_share + ceil_div(split, t)) + ceil_div(scores, t)


def transformer_activations(model: TransformerShape, setup: TrainingSetup) -> int:
    s = sequence_length(model, setup)
    b, h, t = setup.micro_batch, model.hidden, setup.tensor_parallel
    size = setup.bytes.activation
    block = block_activations(model, setup, s)
    if setup.checkpointing == "full":
        # Each block's input (s·b·h elements) is kept; backward recomputes one
        # block at a time, so one block's full set is live on top (§4.1 counts
        # only the 2·s·b·h per layer and leaves this peak out).
        kept = s * b * h * size
        if setup.sequence_parallel:
            kept = ceil_div(kept, t)
        layers = model.layers * kept + block
    else:
        layers = model.layers * block
    # Outside the blocks (§4.3): the embedding dropout mask, the final norm's
    # input, and the logits the cross-entropy keeps in fp32, split by vocab.
    outside = s * b * h * ((1 if model.dropout else 0) + size)
    if model.lm_head:
        outside += ceil_div(4 * s * b * model.vocab, t)
    return layers + outside


def mlp_activations(model: MLPShape, setup: TrainingSetup) -> int:
    """Each layer boundary is kept once: a Linear saves its input, and the ReLU
    after it saves its output, which is the next Linear's input (the same
    tensor). The logits are kept for the loss. So batch x sum(widths) elements."""
    return setup.micro_batch * sum(model.widths) * setup.bytes.activation


def describe_model(model: Model) -> str:
    if isinstance(model, TransformerShape):
        return (
            f"transformer L={model.layers} h={model.hidden} a={model.heads} "
            f"V={model.vocab} ffn={model.ffn_width}"
        )
    if isinstance(model, MLPShape):
        return "mlp " + "-".join(str(w) for w in model.widths)
    assert isinstance(model, ParameterCount)
    return f"{model.params:,} parameters"
