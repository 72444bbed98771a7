"""Hold a shared-GPU worker to its device-memory budget: what prepare() does with
TRAINWAVE_GPU_MEMORY_BUDGET_BYTES, decided by the `submodel` feature mode.

Algorithm overview (`hold_to_budget`, once, in prepare()):
1. No budget (a whole-GPU worker): nothing; the report says why.
2. Cap the caching allocator at the budget: on CUDA,
   torch.cuda.set_per_process_memory_fraction(budget / device memory), so an
   allocation past it raises out-of-memory in this job instead of taking a
   neighbour's memory. Without CUDA there is no allocator to cap: "skipped".
3. Measure the model's plain training peak: one dry run of a whole step on a
   copy (partition with one group: forward, the real loss, backward, an
   optimizer step), the same measure the partitioner plans groups with. On the
   CPU-simulated device tier the measure is of the CPU allocator and a storage
   census; it is model-based, not a GPU measurement.
4. `auto`: the peak fits -> plain training under the cap; it does not ->
   train through the submodel executor, cut into the fewest groups whose
   measured peaks fit the budget. `on`: always the executor. `off`: never
   (the cap of step 2 still applies: the budget is the job's contract).
5. With an arbiter socket (the agent DaemonSet's, mounted by the operator),
   the executor asks it for each group's peak before loading the group; plain
   training asks once for its whole budget and holds it. A worker that dies
   drops its connection, and the arbiter reclaims its grant.

The executor needs what plain training does not: an nn.Sequential (groups are
contiguous children), the loss function (it runs backward itself), a sample
batch (to measure), and an optimizer it can rebuild per group (one parameter
group, no state yet, per-parameter updates). When one is missing, `auto`
reports "skipped: <what>" and trains plainly, still capped; `on` raises.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.optim import Optimizer

from trainwave import contract
from trainwave.runtime.settings import Settings
from trainwave.runtime.submodel.arbiter import ArbiterClient
from trainwave.runtime.submodel.census import StorageCensus
from trainwave.runtime.submodel.executor import SubmodelExecutor
from trainwave.runtime.submodel.ledger import DEVICE
from trainwave.runtime.submodel.partition import Loss, Partition, partition
from trainwave.runtime.submodel.tiers import DeviceTier, device_tier

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class BudgetError(ValueError):
    """submodel=on asked for the executor and something it needs is missing."""


@dataclass
class Held:
    """What hold_to_budget decided, for prepare()'s report and the training step."""

    report: dict[str, str] = field(default_factory=dict)
    executor: SubmodelExecutor | None = None
    arbiter: ArbiterClient | None = None
    census: StorageCensus | None = None  # the simulated tier's independent peak
    budget: int | None = None
    plain_peak: int | None = None
    partition: Partition | None = None

    def peaks(self) -> dict[str, int | None]:
        """Device-memory peaks so far, by who measured them (bytes)."""
        executor, census = self.executor, self.census
        return {
            "budget": self.budget,
            "plain_peak": self.plain_peak,
            "largest_group": self.partition.largest.peak if self.partition else None,
            "ledger": executor.ledger.peak[DEVICE] if executor is not None else None,
            "census": census.peak if census is not None else None,
            "cuda_max_allocated": _cuda_peak(executor.tier) if executor is not None else None,
        }

    def close(self) -> None:
        if self.arbiter is not None:
            self.arbiter.close()
            self.arbiter = None


def hold_to_budget(
    model: nn.Module,
    optimizer: Optimizer,
    settings: Settings,
    mode: str,
    *,
    loss_fn: LossFn | None,
    sample: tuple[torch.Tensor, torch.Tensor] | None,
    world_size: int,
) -> Held:
    held = Held(budget=settings.gpu_memory_budget_bytes)
    budget = held.budget
    if budget is None:
        why = f"no {contract.ENV_GPU_MEMORY_BUDGET} (not a shared-GPU worker)"
        held.report["submodel"] = "off" if mode == "off" else f"off: {why}"
        return held
    tier = device_tier()
    held.report["memory_cap"] = cap_allocator(tier, budget)
    if mode == "off":
        held.report["submodel"] = f"off: plain training, budget {budget} B not planned for"
        return _with_arbiter(held, settings, budget)
    missing = _missing(model, optimizer, loss_fn, sample, world_size)
    if missing:
        if mode == "on":
            raise BudgetError(f"submodel=on: {missing}")
        held.report["submodel"] = f"skipped: {missing}; plain training under the cap"
        return _with_arbiter(held, settings, budget)
    assert isinstance(model, nn.Sequential)
    assert loss_fn is not None
    assert sample is not None
    factory = optimizer_factory(optimizer)
    inputs, targets = sample
    loss = Loss(loss_fn, targets)
    whole = partition(model, inputs, factory, groups=1, loss=loss)
    held.plain_peak = whole.largest.peak
    if mode == "auto" and held.plain_peak <= budget:
        held.report["submodel"] = (
            f"off: the measured peak {held.plain_peak} B fits the budget {budget} B"
            + _simulated(tier)
        )
        return _with_arbiter(held, settings, budget)
    held.partition = partition(model, inputs, factory, budget=budget, loss=loss)
    held.arbiter = _arbiter(settings, held.report)
    if tier.simulated:
        held.census = StorageCensus()
    held.executor = SubmodelExecutor(
        model,
        held.partition,
        factory,
        loss_fn,
        budget,
        tier=tier,
        turns=held.arbiter,
        census=held.census,
    )
    why = (
        "submodel=on"
        if mode == "on" and held.plain_peak <= budget
        else f"the measured peak {held.plain_peak} B exceeds the budget {budget} B"
    )
    groups = held.partition.groups
    held.report["submodel"] = (
        f"on: {why}; {len(groups)} groups streamed through the budget, largest "
        f"{held.partition.largest.peak} B{_simulated(tier)}"
    )
    return held


def cap_allocator(tier: DeviceTier, budget: int) -> str:
    if tier.simulated:
        return "skipped: no CUDA (the device tier is simulated on the CPU; nothing to cap)"
    total = torch.cuda.get_device_properties(tier.device).total_memory
    fraction = min(1.0, budget / total)
    torch.cuda.set_per_process_memory_fraction(fraction, tier.device)
    return f"on: caching allocator capped at {budget} B ({fraction:.4f} of {total} B)"


def optimizer_factory(optimizer: Optimizer) -> Callable[[list[nn.Parameter]], Optimizer]:
    """The same optimizer class and settings, for one group's parameters."""
    cls = type(optimizer)
    # defaults can hold entries the constructor does not take (AdamW's
    # decoupled_weight_decay): pass only what it accepts.
    accepted = inspect.signature(cls.__init__).parameters
    defaults = {k: v for k, v in optimizer.defaults.items() if k in accepted}

    def make(params: list[nn.Parameter]) -> Optimizer:
        return cls(params, **defaults)

    return make


def _missing(
    model: nn.Module,
    optimizer: Optimizer,
    loss_fn: LossFn | None,
    sample: tuple[torch.Tensor, torch.Tensor] | None,
    world_size: int,
) -> str:
    """What the executor needs and does not have ("" when nothing)."""
    if world_size > 1:
        return f"the submodel executor trains one process, this job has {world_size}"
    if not isinstance(model, nn.Sequential):
        return f"the model is a {type(model).__name__}; the executor cuts an nn.Sequential"
    if loss_fn is None:
        return "pass loss_fn= to prepare() (the executor runs backward itself)"
    if sample is None:
        return "pass sample=(inputs, targets) or a loader to prepare() (to measure the peak)"
    if len(optimizer.param_groups) != 1:
        return f"the optimizer has {len(optimizer.param_groups)} parameter groups; expected 1"
    if any(optimizer.state.values()):
        return "the optimizer already has state; pass a fresh one"
    return ""


def _with_arbiter(held: Held, settings: Settings, budget: int) -> Held:
    """Plain training takes its whole budget from the arbiter once and holds it."""
    held.arbiter = _arbiter(settings, held.report)
    if held.arbiter is not None:
        held.arbiter.acquire(budget)
        held.report["arbiter"] += f"; holds {budget} B for the whole run"
    return held


def _arbiter(settings: Settings, report: dict[str, str]) -> ArbiterClient | None:
    path = settings.arbiter_socket
    if path is None:
        report["arbiter"] = f"off: no {contract.ENV_ARBITER_SOCKET} (no arbiter on this node)"
        return None
    if not os.path.exists(path):
        report["arbiter"] = f"skipped: {contract.ENV_ARBITER_SOCKET}={path} does not exist"
        return None
    identity = settings.identity
    job = f"{identity.namespace}/{identity.job_name}/rank-{identity.rank}/pid-{os.getpid()}"
    report["arbiter"] = f"on: turns from {path} as {job}"
    return ArbiterClient(path, job=job)


def first_batch(loader: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The loader's first (inputs, targets), from a fresh iterator, or None."""
    if loader is None:
        return None
    batch = next(iter(loader), None)
    if isinstance(batch, list | tuple) and len(batch) == 2:
        return batch[0], batch[1]
    return None


def _simulated(tier: DeviceTier) -> str:
    return " (model-based: the device tier is simulated on the CPU)" if tier.simulated else ""


def _cuda_peak(tier: DeviceTier) -> int | None:
    if tier.simulated:
        return None
    return int(torch.cuda.max_memory_allocated(tier.device))
