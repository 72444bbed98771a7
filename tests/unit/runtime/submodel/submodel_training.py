"""Helpers shared by the submodel tests: deterministic setup, plain training,
training through the executor."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from submodel_models import MODELS, make_batches
from torch import nn

from trainwave.runtime.submodel.census import StorageCensus
from trainwave.runtime.submodel.executor import SubmodelExecutor
from trainwave.runtime.submodel.partition import Loss, Partition, partition

OPTIMIZERS: dict[str, Callable[[list[nn.Parameter]], torch.optim.Optimizer]] = {
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.01),
    "sgd-momentum": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9),
}
loss_fn = nn.functional.cross_entropy


@contextmanager
def deterministic() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(False)
        torch.set_num_threads(threads)


@dataclass
class Run:
    losses: list[float]
    model: nn.Sequential
    optimizer_states: list[dict[str, torch.Tensor]]


def make_case(
    kind: str, steps: int, seed: int = 0
) -> tuple[nn.Sequential, list[tuple[torch.Tensor, torch.Tensor]]]:
    torch.manual_seed(seed)
    return MODELS[kind](), make_batches(kind, steps)


def train_plain(
    model: nn.Sequential, batches, optimizer: str, accumulate: int = 1, seed: int = 1
) -> Run:
    model = copy.deepcopy(model)
    torch.manual_seed(seed)
    opt = OPTIMIZERS[optimizer](list(model.parameters()))
    losses = []
    for step, (x, y) in enumerate(batches):
        loss = loss_fn(model(x), y)
        loss.backward()
        losses.append(loss.item())
        if (step + 1) % accumulate == 0:
            opt.step()
            opt.zero_grad(set_to_none=True)
    return Run(losses, model, [opt.state[p] for p in model.parameters()])


def plan(model: nn.Sequential, batches, optimizer: str, groups: int) -> Partition:
    x, y = batches[0]
    return partition(model, x, OPTIMIZERS[optimizer], groups=groups, loss=Loss(loss_fn, y))


def make_executor(
    model,
    part,
    optimizer: str,
    budget: int | str | None = "largest",
    census: StorageCensus | None = None,
) -> SubmodelExecutor:
    """budget: bytes, "largest" (the tightest the executor accepts) or None (from the env)."""
    if budget == "largest":
        budget = part.largest.peak
    return SubmodelExecutor(model, part, OPTIMIZERS[optimizer], loss_fn, budget, census=census)


def train_submodel(
    executor: SubmodelExecutor,
    model: nn.Sequential,
    batches,
    accumulate: int = 1,
    *,
    seed: int = 1,
    after_step=None,
) -> Run:
    torch.manual_seed(seed)
    losses = []
    for step, (x, y) in enumerate(batches):
        losses.append(executor.step(x, y, apply=(step + 1) % accumulate == 0).item())
        if after_step is not None:
            after_step(step)
    states = [g.optimizer.state[p] for g in executor.groups if g.optimizer for p in g.params]
    return Run(losses, model, states)
