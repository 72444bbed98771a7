"""Model shapes and their parameter counts.

Pure. A model is described either by its architecture shape (a transformer or a
plain MLP) or, when only its size is known, by a parameter count. Counts are
exact for the architectures spelt out here, so `gpt2-124m` gives GPT-2's
124,439,808 and `llama-7b` LLaMA's 6,738,415,616.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainwave.sizing.errors import SizingError, require_positive


@dataclass(frozen=True)
class TransformerShape:
    """A decoder (GPT, LLaMA) or encoder (BERT) stack of identical blocks.

    `ffn` defaults to 4 x hidden. `gated_mlp` is LLaMA's SwiGLU (three matrices,
    gate and up of hidden x ffn, down of ffn x hidden); otherwise two matrices.
    `positions` > 0 adds a learned position table of that many rows. A
    `post_norm` model (BERT) normalises after the embeddings and after each
    sub-layer instead of before, so it has no final norm: the same count.
    """

    layers: int
    hidden: int
    heads: int
    vocab: int
    ffn: int = 0
    gated_mlp: bool = False
    rmsnorm: bool = False
    bias: bool = True
    tied_embeddings: bool = True
    lm_head: bool = True
    positions: int = 0
    token_types: int = 0
    post_norm: bool = False
    pooler: bool = False
    dropout: bool = True

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "heads", "vocab"):
            require_positive(name, getattr(self, name))
        for name in ("ffn", "positions", "token_types"):
            if getattr(self, name) < 0:
                raise SizingError(name, getattr(self, name), "an integer >= 0")
        if self.hidden % self.heads:
            raise SizingError(
                "heads",
                self.heads,
                f"a divisor of hidden ({self.hidden}), so heads have equal width",
            )

    @property
    def ffn_width(self) -> int:
        return self.ffn or 4 * self.hidden

    def norm_params(self) -> int:
        """One normalisation layer: a scale, plus a shift for LayerNorm."""
        return self.hidden if self.rmsnorm else 2 * self.hidden

    def block_params(self) -> int:
        h, f, b = self.hidden, self.ffn_width, int(self.bias)
        attention = 4 * h * h + b * 4 * h  # Q, K, V and output projections
        mlp = 3 * h * f if self.gated_mlp else 2 * h * f
        mlp += b * ((2 if self.gated_mlp else 1) * f + h)
        return attention + mlp + 2 * self.norm_params()

    def lookup_params(self) -> int:
        """Tables that are only indexed, never multiplied (no FLOPs per token)."""
        h = self.hidden
        lookups = (self.positions + self.token_types) * h
        if not (self.lm_head and self.tied_embeddings):
            lookups += self.vocab * h  # token table, unless it doubles as the LM head
        return lookups

    def head_params(self) -> int:
        """The LM head's matrix; a tied head reuses the token table."""
        return self.vocab * self.hidden if self.lm_head else 0

    def pooler_params(self) -> int:
        return self.hidden * self.hidden + self.hidden if self.pooler else 0

    def parameters(self) -> int:
        h = self.hidden
        total = (self.vocab + self.positions + self.token_types) * h
        if self.lm_head and not self.tied_embeddings:
            total += self.vocab * h
        total += self.layers * self.block_params()
        total += self.norm_params()  # the final norm, or post-norm's embedding norm
        return total + self.pooler_params()


@dataclass(frozen=True)
class MLPShape:
    """Fully connected layers; `widths` lists input, hidden and output widths."""

    widths: tuple[int, ...]
    bias: bool = True

    def __post_init__(self) -> None:
        if len(self.widths) < 2:
            raise SizingError("widths", self.widths, "at least an input and an output width")
        for width in self.widths:
            require_positive("widths", width)

    def parameters(self) -> int:
        pairs = zip(self.widths, self.widths[1:], strict=False)
        return sum(i * o + (o if self.bias else 0) for i, o in pairs)


@dataclass(frozen=True)
class ParameterCount:
    """Only the size is known: memory for weights and optimizer, FLOPs by 6N."""

    params: int

    def __post_init__(self) -> None:
        require_positive("params", self.params)

    def parameters(self) -> int:
        return self.params


Model = TransformerShape | MLPShape | ParameterCount

PRESETS: dict[str, Model] = {
    # Radford et al. 2019, the 124M checkpoint: tied head, learned positions.
    "gpt2-124m": TransformerShape(layers=12, hidden=768, heads=12, vocab=50257, positions=1024),
    # Touvron et al. 2023: SwiGLU of 11008, RMSNorm, no biases, untied head, RoPE.
    "llama-7b": TransformerShape(
        layers=32,
        hidden=4096,
        heads=32,
        vocab=32000,
        ffn=11008,
        gated_mlp=True,
        rmsnorm=True,
        bias=False,
        tied_embeddings=False,
        dropout=False,
    ),
    # Devlin et al. 2019, BERT-base with its pooler, without a pre-training head.
    "bert-base": TransformerShape(
        layers=12,
        hidden=768,
        heads=12,
        vocab=30522,
        positions=512,
        token_types=2,
        post_norm=True,
        pooler=True,
        lm_head=False,
    ),
}


def preset(name: str) -> Model:
    try:
        return PRESETS[name]
    except KeyError:
        raise SizingError("model", name, f"one of {', '.join(sorted(PRESETS))}") from None
