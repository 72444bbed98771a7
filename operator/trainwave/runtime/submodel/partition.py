"""Cut a sequential model into contiguous groups of roughly equal peak memory.

Algorithm overview:
1. Profile each unit (a child of the nn.Sequential) by a dry run on a copy:
   forward, backward with a gradient of ones, one optimizer step, under a
   StorageCensus. A unit's cost is its parameters and buffers plus the census
   peak (activations, gradients, optimizer state, temporaries). On the `meta`
   device the dry run allocates nothing, so GPU-sized models can be profiled
   on any machine.
2. Choose cut points minimising the largest group's cost (a group costs its
   input plus the sum of its units' costs, which over-estimates: units' peaks
   do not all coincide), exactly, by dynamic programming.
3. Measure each chosen group by the same dry run, as one block, with the CPU
   allocator's events as well as the census (the larger wins). The executor
   plans with these measured peaks, not with the estimates. With a budget,
   start from half the group count the estimates ask for and add groups
   until every measured peak fits.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch
from torch import nn

from trainwave.runtime.submodel.census import StorageCensus, allocator_events, running_peak

OptimizerFactory = Callable[[list[nn.Parameter]], torch.optim.Optimizer]
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Loss:
    """The loss and a sample target: the last group's dry run backpropagates the
    real loss, whose own saved tensors (log-softmax output...) count too."""

    fn: LossFn
    target: torch.Tensor


class PartitionError(ValueError):
    """A unit alone exceeds the budget, or the request cannot be met."""


@dataclass(frozen=True)
class UnitProfile:
    name: str
    resident_bytes: int  # parameters and buffers
    dynamic_peak: int  # optimizer state + census peak of a forward, backward and step
    input_bytes: int
    output_bytes: int

    @property
    def cost(self) -> int:
        return self.resident_bytes + self.dynamic_peak


@dataclass(frozen=True)
class Group:
    start: int  # first unit, inclusive
    stop: int  # last unit, exclusive
    names: tuple[str, ...]
    estimate: int
    peak: int  # measured by a dry run of the whole group
    param_bytes: int
    input_bytes: int

    def describe(self) -> str:
        return f"units {self.start}..{self.stop - 1} ({', '.join(self.names)})"


@dataclass(frozen=True)
class Partition:
    groups: tuple[Group, ...]

    @property
    def largest(self) -> Group:
        return max(self.groups, key=lambda g: g.peak)

    def bounds(self) -> list[tuple[int, int]]:
        return [(g.start, g.stop) for g in self.groups]


# A step holds a little the dry run does not: the loss value, scalars of the
# step, and the RNG-state snapshot taken and restored around each group
# (5,056 B for the CPU generator; host memory on a GPU, but the simulated
# device shares the CPU allocator). A stated allowance, not a measurement.
RESERVE_BYTES = 16 << 10
RESERVE_FRACTION = 0.01


def with_reserve(peak: int) -> int:
    return peak + RESERVE_BYTES + int(peak * RESERVE_FRACTION)


def nbytes(tensors: Iterable[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def dry_run(
    block: nn.Module,
    sample: torch.Tensor,
    optimizer_factory: OptimizerFactory,
    *,
    first: bool,
    loss: Loss | None = None,
    with_allocator: bool = False,
) -> tuple[int, torch.Tensor]:
    """Peak of one steady-state training step of `block` (a copy is used), not
    counting its parameters and buffers, and its output."""
    block = copy.deepcopy(block)
    inp = sample.detach().clone()
    if not first and inp.is_floating_point():
        inp.requires_grad_(True)
    params = [p for p in block.parameters() if p.requires_grad]
    optimizer = optimizer_factory(params) if params else None

    def one_step() -> torch.Tensor:
        target = loss.target.clone() if loss is not None else None
        out = block(inp)
        if loss is not None and target is not None:
            torch.autograd.backward(loss.fn(out, target))
        elif out.requires_grad:
            torch.autograd.backward(out, torch.ones_like(out))
        del target
        if optimizer is not None:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        inp.grad = None
        result: torch.Tensor = out.detach()
        return result

    # A first, unmeasured step creates the optimizer state, which the executor
    # then holds through every later step's backward.
    one_step()
    census = StorageCensus()
    # The census sees every tensor an operator returns but not the scratch a
    # kernel allocates inside itself (im2col buffers of a CPU convolution,
    # cuDNN workspaces); the allocator sees those too, so a group's peak is
    # taken from it where it is available.
    measure: AbstractContextManager[list[int]] = nullcontext([])
    if with_allocator and inp.device.type == "cpu":
        measure = allocator_events()
    with measure as sizes, census:
        out = one_step()
    state = 0
    if optimizer is not None:
        for values in optimizer.state.values():
            state += nbytes(v for v in values.values() if isinstance(v, torch.Tensor))
    return state + max(census.peak, running_peak(sizes)), out


def profile_units(
    model: nn.Sequential,
    sample: torch.Tensor,
    optimizer_factory: OptimizerFactory,
    loss: Loss | None = None,
) -> tuple[list[UnitProfile], list[torch.Tensor]]:
    """Each unit's profile, and each unit's input in the dry run."""
    profiles = []
    inputs = []
    x = sample
    count = len(model)
    for index, (name, unit) in enumerate(model.named_children()):
        last_loss = loss if index == count - 1 else None
        peak, out = dry_run(unit, x, optimizer_factory, first=index == 0, loss=last_loss)
        resident = nbytes(unit.parameters()) + nbytes(unit.buffers())
        profiles.append(
            UnitProfile(
                name=name,
                resident_bytes=resident,
                dynamic_peak=peak,
                input_bytes=nbytes([x]),
                output_bytes=nbytes([out]),
            )
        )
        inputs.append(x)
        x = out
    return profiles, inputs


def group_cost(profiles: Sequence[UnitProfile], start: int, stop: int) -> int:
    return profiles[start].input_bytes + sum(p.cost for p in profiles[start:stop])


def balanced_cuts(profiles: Sequence[UnitProfile], groups: int) -> list[tuple[int, int]]:
    """Contiguous bounds for `groups` groups minimising the largest cost (exact DP)."""
    n = len(profiles)
    if not 1 <= groups <= n:
        raise PartitionError(f"groups: got {groups}; expected 1..{n} (the model has {n} units)")
    inf = float("inf")
    # best[k][j]: the smallest possible largest cost splitting units[:j] into k groups.
    best = [[inf] * (n + 1) for _ in range(groups + 1)]
    cut = [[0] * (n + 1) for _ in range(groups + 1)]
    best[0][0] = 0
    for k in range(1, groups + 1):
        for j in range(k, n + 1):
            for i in range(k - 1, j):
                value = max(best[k - 1][i], group_cost(profiles, i, j))
                if value < best[k][j]:
                    best[k][j], cut[k][j] = value, i
    bounds = []
    j = n
    for k in range(groups, 0, -1):
        i = cut[k][j]
        bounds.append((i, j))
        j = i
    return bounds[::-1]


def fewest_groups(profiles: Sequence[UnitProfile], budget: int) -> int:
    for index, profile in enumerate(profiles):
        alone = group_cost(profiles, index, index + 1)
        if alone > budget:
            raise PartitionError(
                f"budget {budget} B is below unit {index} ({profile.name}): its estimated "
                f"peak is {alone} B; give more memory or split that module"
            )
    count, start = 0, 0
    while start < len(profiles):
        stop = start + 1
        while stop < len(profiles) and group_cost(profiles, start, stop + 1) <= budget:
            stop += 1
        count, start = count + 1, stop
    return count


def partition(
    model: nn.Sequential,
    sample: torch.Tensor,
    optimizer_factory: OptimizerFactory,
    *,
    groups: int | None = None,
    budget: int | None = None,
    loss: Loss | None = None,
) -> Partition:
    """Partition `model` into `groups` groups, or the fewest that fit `budget`.

    Without `loss`, the last group is measured backpropagating ones, which
    leaves out the loss's own memory."""
    if (groups is None) == (budget is None):
        raise PartitionError("partition: give exactly one of groups= or budget=")
    # Dry runs draw random numbers (dropout); the caller's stream must not move.
    with torch.random.fork_rng():
        return measure_groups(
            model,
            sample=sample,
            optimizer_factory=optimizer_factory,
            groups=groups,
            budget=budget,
            loss=loss,
        )


def measure_groups(
    model: nn.Sequential,
    *,
    sample: torch.Tensor,
    optimizer_factory: OptimizerFactory,
    groups: int | None,
    budget: int | None,
    loss: Loss | None,
) -> Partition:
    profiles, inputs = profile_units(model, sample, optimizer_factory, loss)
    units = list(model.children())
    if groups is not None:
        return measure(
            units,
            profiles=profiles,
            inputs=inputs,
            count=groups,
            factory=optimizer_factory,
            loss=loss,
        )
    limit = int(budget or 0)
    # Estimates over-count (unit peaks do not coincide), so fewer groups than
    # the estimate asks for may fit once measured: start at half of it.
    count = max(1, (fewest_groups(profiles, limit) + 1) // 2)
    while True:
        result = measure(
            units,
            profiles=profiles,
            inputs=inputs,
            count=count,
            factory=optimizer_factory,
            loss=loss,
        )
        if result.largest.peak <= limit:
            return result
        if count == len(units):
            raise PartitionError(
                f"budget {limit} B is below {result.largest.describe()}: measured peak "
                f"{result.largest.peak} B even with one unit per group"
            )
        count += 1


def measure(
    units: list[nn.Module],
    *,
    profiles: list[UnitProfile],
    inputs: list[torch.Tensor],
    count: int,
    factory: OptimizerFactory,
    loss: Loss | None,
) -> Partition:
    result = []
    for start, stop in balanced_cuts(profiles, count):
        block = nn.Sequential(*units[start:stop])
        last_loss = loss if stop == len(units) else None
        peak, _ = dry_run(
            block,
            inputs[start],
            factory,
            first=start == 0,
            loss=last_loss,
            with_allocator=True,
        )
        resident = nbytes(block.parameters()) + nbytes(block.buffers())
        result.append(
            Group(
                start=start,
                stop=stop,
                names=tuple(p.name for p in profiles[start:stop]),
                estimate=group_cost(profiles, start, stop),
                # The dry run's input was made before it was measured; the
                # gradient of its output (ones) was made inside, so is counted.
                peak=with_reserve(resident + peak + nbytes([inputs[start]])),
                param_bytes=nbytes(block.parameters()),
                input_bytes=nbytes([inputs[start]]),
            )
        )
    return Partition(tuple(result))
