"""Factories for the small models and data the submodel tests train."""

from __future__ import annotations

import torch
from torch import nn


def make_mlp(width: int = 64, depth: int = 6, classes: int = 10) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Linear(32, width), nn.ReLU()]
    for _ in range(depth - 2):
        layers += [nn.Linear(width, width), nn.ReLU(), nn.Dropout(0.1)]
    layers.append(nn.Linear(width, classes))
    return nn.Sequential(*layers)


def make_cnn(channels: int = 8, classes: int = 10) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(3, channels, 3, padding=1),
        nn.BatchNorm2d(channels),
        nn.ReLU(),
        nn.Conv2d(channels, 2 * channels, 3, padding=1, stride=2),
        nn.BatchNorm2d(2 * channels),
        nn.ReLU(),
        nn.Conv2d(2 * channels, 2 * channels, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(2),
        nn.Flatten(),
        nn.Linear(8 * channels, classes),
    )


class TokenLogits(nn.Module):
    """The LM head, flattened so cross-entropy takes (tokens, vocab)."""

    def __init__(self, hidden: int, vocab: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(x)).flatten(0, 1)


def make_transformer(vocab: int = 50, hidden: int = 32, layers: int = 3) -> nn.Sequential:
    blocks = [
        nn.TransformerEncoderLayer(
            hidden, nhead=4, dim_feedforward=2 * hidden, dropout=0.1, batch_first=True
        )
        for _ in range(layers)
    ]
    return nn.Sequential(nn.Embedding(vocab, hidden), *blocks, TokenLogits(hidden, vocab))


def make_batches(
    kind: str, steps: int, batch: int = 16, seed: int = 7
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(steps):
        if kind == "mlp":
            x = torch.randn(batch, 32, generator=generator)
            y = torch.randint(0, 10, (batch,), generator=generator)
        elif kind == "cnn":
            x = torch.randn(batch, 3, 8, 8, generator=generator)
            y = torch.randint(0, 10, (batch,), generator=generator)
        else:
            x = torch.randint(0, 50, (batch, 12), generator=generator)
            y = torch.randint(0, 50, (batch * 12,), generator=generator)
        batches.append((x, y))
    return batches


MODELS = {"mlp": make_mlp, "cnn": make_cnn, "transformer": make_transformer}
