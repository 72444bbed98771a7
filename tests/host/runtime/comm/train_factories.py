"""A tiny regression problem, the same in every process, and its single-process reference."""

from __future__ import annotations

import torch

IN, HIDDEN, OUT = 16, 32, 4
GLOBAL_BATCH = 16
LR = 0.1


def make_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(IN, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, OUT)
    )


def make_batch(step: int, n: int = GLOBAL_BATCH) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(100 + step)
    return torch.randn(n, IN, generator=gen), torch.randn(n, OUT, generator=gen)


def loss_fn(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.mse_loss(out, target)


def reference_params(steps: int, seed: int = 0) -> list[torch.Tensor]:
    """Plain SGD on the whole global batch in one process: what every variant must reproduce."""
    model = make_model(seed)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(steps):
        x, y = make_batch(step)
        loss_fn(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    return [p.detach().clone() for p in model.parameters()]


def max_abs_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    # detach: a caller may compare parameters that still require grad
    return max(float((x - y).detach().abs().max()) for x, y in zip(a, b, strict=True))
