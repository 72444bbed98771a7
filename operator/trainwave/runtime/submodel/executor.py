"""Train a partitioned model within a device-memory budget.

Algorithm overview (one call to `step`):
1. Forward, without autograd, group by group: load the group's parameters and
   buffers, run it, copy its output to the host (scratch arena), unload. The
   RNG state before each group is kept; buffer updates (BatchNorm statistics)
   are discarded here because step 2 makes them again.
2. Backward, from the last group to the first: load the group (parameters,
   buffers, gradients kept from earlier micro-batches, optimizer state when
   stepping), restore its RNG state, recompute its forward from the saved
   input with autograd, and backpropagate the loss (last group) or the
   gradient of its output (others). The gradient of its input is handed to the
   group before it. When stepping, the group's optimizer steps now, while the
   group is resident, and its gradients are dropped (zero_grad to None).
3. Unload: only what changed goes back to the host (parameters and state after
   a step, buffers after recomputation, kept gradients).

Invariants: at most one group is resident; every parameter, buffer, gradient
and optimizer-state tensor is in exactly one tier (the ledger records it); the
ledger never goes over budget (it raises first); the RNG ends where the plain
forward would leave it. With deterministic kernels the losses and weights are
bitwise those of training without the allocator: every value is computed by
the same operations on the same inputs, only where it lives changes. That
needs optimizers that update each parameter from its own gradient and state
(SGD, Adam...), not ones coupling parameters (global-norm clipping, LAMB's
trust ratio over groups, LBFGS).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Hashable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import nn

from trainwave import contract
from trainwave.runtime.submodel.census import StorageCensus, storage_key
from trainwave.runtime.submodel.ledger import DEVICE, HOST, Ledger
from trainwave.runtime.submodel.partition import OptimizerFactory, Partition
from trainwave.runtime.submodel.tiers import DeviceTier, HostArena, device_tier

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
# ("param" | "buffer" | "grad", index) or ("state", index, name), within a group.
Key = tuple[Any, ...]


# Placeholder for per-step attributes between steps; holds no memory.
NOTHING = torch.empty(0)


class BudgetTooSmall(ValueError):
    """The largest group does not fit the budget."""


class Turns(Protocol):
    """What the executor needs from the arbiter client."""

    def acquire(self, nbytes: int) -> None: ...
    def release(self) -> None: ...


@dataclass
class Traffic:
    to_device: int = 0
    to_host: int = 0


@dataclass
class GroupState:
    index: int
    block: nn.Sequential
    peak: int
    params: list[nn.Parameter]
    buffers: list[torch.Tensor]
    optimizer: torch.optim.Optimizer | None  # None for a group without parameters
    home: dict[Key, torch.Tensor] = field(default_factory=dict)


class SubmodelExecutor:
    """Trains `model`, cut by `partition`, within `budget` bytes of device
    memory (default: TRAINWAVE_GPU_MEMORY_BUDGET_BYTES, set by the operator).
    `optimizer_factory` makes one optimizer per group; `turns`, the arbiter
    client, is asked for each group's peak before the group is loaded."""

    def __init__(
        self,
        model: nn.Sequential,
        partition: Partition,
        optimizer_factory: OptimizerFactory,
        loss_fn: LossFn,
        budget: int | None = None,
        *,
        tier: DeviceTier | None = None,
        turns: Turns | None = None,
        census: StorageCensus | None = None,
    ) -> None:
        budget = budget if budget is not None else budget_from_environment()
        largest = partition.largest
        if largest.peak > budget:
            raise BudgetTooSmall(
                f"budget {budget} B is below the largest group, group "
                f"{partition.groups.index(largest)}: {largest.describe()} peaks at "
                f"{largest.peak} B; give at least that, or partition into more groups"
            )
        self.tier = tier or device_tier()
        self.loss_fn = loss_fn
        self.turns = turns
        self.ledger = Ledger(budget)
        self.traffic = Traffic()
        self.arena_keys: set[int] = set()
        pinned = not self.tier.simulated
        self.static = HostArena(pinned=pinned, keys=self.arena_keys)
        self.scratch = HostArena(pinned=pinned, keys=self.arena_keys)
        self.census = census
        if census is not None:
            census.ignored = self.arena_keys
        units = list(model.children())
        self.groups: list[GroupState] = []
        for index, group in enumerate(partition.groups):
            block = nn.Sequential(*units[group.start : group.stop])
            params = [p for p in block.parameters() if p.requires_grad]
            self.groups.append(
                GroupState(
                    index=index,
                    block=block,
                    peak=group.peak,
                    params=params,
                    buffers=list(block.buffers()),
                    optimizer=optimizer_factory(params) if params else None,
                )
            )
        for state in self.groups:
            for key, tensor in self.resident_tensors(state):
                self.send_home(state, key, tensor, write=True)
        self.saved: set[int] = set()
        self.targets = self.loss_value = NOTHING
        self.after_forward: list[torch.Tensor] = []

    # --- the step -----------------------------------------------------------

    def step(
        self, inputs: torch.Tensor, targets: torch.Tensor, *, apply: bool = True
    ) -> torch.Tensor:
        """One micro-batch; `apply=False` keeps the gradients for accumulation."""
        with ExitStack() as stack:
            if self.census is not None:
                stack.enter_context(self.census)
            return self._step(inputs, targets, apply)

    def _step(self, inputs: torch.Tensor, targets: torch.Tensor, apply: bool) -> torch.Tensor:
        boundaries, rng = self._forward(inputs)
        self.targets = targets
        self.loss_value = NOTHING
        self.after_forward = rng[-1]
        grad_out: torch.Tensor | None = None
        for state in reversed(self.groups):
            with self.resident(state, backward=True, stepping=apply):
                self.restore_rng(rng[state.index])
                grad_out = self._backward(state, boundaries[state.index], grad_out)
                if apply:
                    self._apply(state)
        self.restore_rng(self.after_forward)
        self.scratch.reset()
        self.targets = NOTHING
        loss, self.loss_value = self.loss_value, NOTHING
        return loss

    def _forward(self, inputs: torch.Tensor) -> tuple[list[torch.Tensor], list[list[torch.Tensor]]]:
        """Every group but the last, without autograd: the host copies of each
        group's input, and the RNG state before each group."""
        boundaries = [inputs]
        rng = []
        for state in self.groups[:-1]:
            with self.resident(state, backward=False):
                rng.append(self.keep_rng())
                x = self.load_boundary(boundaries[-1], ("boundary", state.index))
                with torch.no_grad():
                    y = state.block(x)
                del x
                self.ledger.drop(("boundary", state.index))
                self.ledger.place(("boundary", state.index + 1), DEVICE, tensor_bytes(y))
                home = self.scratch.slot(y)
                home.copy_(y)
                self.traffic.to_host += tensor_bytes(y)
                boundaries.append(home)
                del y
                self.ledger.drop(("boundary", state.index + 1))
        rng.append(self.keep_rng())
        return boundaries, rng

    def _backward(
        self, state: GroupState, boundary: torch.Tensor, grad_out: torch.Tensor | None
    ) -> torch.Tensor | None:
        """Recompute the group from its input and backpropagate; returns the
        gradient of its input for the group before it."""
        x = self.load_boundary(boundary, ("boundary", state.index))
        if state.index > 0 and x.is_floating_point():
            x.requires_grad_(True)
        with self.saving(x), torch.enable_grad():
            out = state.block(x)
            if state is self.groups[-1]:
                self.after_forward = self.keep_rng()
                target = self.load_boundary(self.targets, ("targets",))
                loss = self.loss_fn(out, target)
                del target
                torch.autograd.backward(loss)
                self.loss_value = loss.detach().to("cpu", copy=True)
                del loss
            else:
                assert grad_out is not None
                torch.autograd.backward(out, grad_out)
        del out, grad_out
        self.ledger.drop(("grad_out",))
        self.ledger.drop(("targets",))
        self.release_saved()
        grad_in = x.grad if state.index > 0 else None
        if grad_in is not None:
            self.ledger.place(("grad_out",), DEVICE, tensor_bytes(grad_in))
        del x
        self.ledger.drop(("boundary", state.index))
        for i, p in enumerate(state.params):
            if p.grad is not None:
                self.ledger.place(self.ledger_key(state, ("grad", i)), DEVICE, tensor_bytes(p.grad))
        return grad_in

    def _apply(self, state: GroupState) -> None:
        """The group's optimizer step, then its gradients go (zero_grad to None)."""
        if state.optimizer is None:
            return
        state.optimizer.step()
        state.optimizer.zero_grad(set_to_none=True)
        for i in range(len(state.params)):
            self.ledger.drop(self.ledger_key(state, ("grad", i)))
        # State made by this first step (Adam's moments) is on the device.
        for key, tensor in self.resident_tensors(state, optimizer=True):
            if self.ledger.tier_of(self.ledger_key(state, key)) is None:
                self.ledger.place(self.ledger_key(state, key), DEVICE, tensor_bytes(tensor))

    # --- moving groups between tiers ----------------------------------------

    @contextmanager
    def resident(
        self, state: GroupState, *, backward: bool, stepping: bool = False
    ) -> Iterator[None]:
        if self.turns is not None:
            self.turns.acquire(state.peak)
        try:
            for key, tensor in self.resident_tensors(state, grads=backward, optimizer=stepping):
                self.bring(state, key, tensor)
            yield
            # Forward-only runs change nothing worth keeping: buffer updates
            # are made again, and kept, by the recomputation in backward.
            for key, tensor in self.resident_tensors(state, grads=True, optimizer=True):
                if self.ledger.tier_of(self.ledger_key(state, key)) == DEVICE or (
                    key not in state.home
                ):
                    write = backward and (key[0] != "param" or stepping)
                    self.send_home(state, key, tensor, write=write or key not in state.home)
        finally:
            if self.turns is not None:
                self.turns.release()

    def resident_tensors(
        self, state: GroupState, grads: bool = False, optimizer: bool = False
    ) -> list[tuple[Key, torch.Tensor]]:
        found: list[tuple[Key, torch.Tensor]] = [
            (("param", i), p) for i, p in enumerate(state.params)
        ]
        found += [(("buffer", i), b) for i, b in enumerate(state.buffers)]
        if grads:
            found += [
                (("grad", i), p.grad) for i, p in enumerate(state.params) if p.grad is not None
            ]
        if optimizer and state.optimizer is not None:
            for i, p in enumerate(state.params):
                for name, value in state.optimizer.state.get(p, {}).items():
                    if isinstance(value, torch.Tensor):
                        found.append((("state", i, name), value))
        return found

    def ledger_key(self, state: GroupState, key: Key) -> Hashable:
        return (state.index, key)

    def bring(self, state: GroupState, key: Key, tensor: torch.Tensor) -> None:
        home = state.home[key]
        self.ledger.place(self.ledger_key(state, key), DEVICE, tensor_bytes(home))
        self.assign(state, key, self.tier.to_device(home))
        self.traffic.to_device += tensor_bytes(home)

    def send_home(self, state: GroupState, key: Key, tensor: torch.Tensor, *, write: bool) -> None:
        home = state.home.get(key)
        if home is None:
            home = state.home[key] = self.static.slot(tensor)
        if write:
            home.copy_(tensor)
            self.traffic.to_host += tensor_bytes(tensor)
        self.assign(state, key, home)
        self.ledger.place(self.ledger_key(state, key), HOST, tensor_bytes(home))

    def assign(self, state: GroupState, key: Key, value: torch.Tensor) -> None:
        kind, index = key[0], key[1]
        if kind == "param":
            state.params[index].data = value
        elif kind == "buffer":
            state.buffers[index].data = value
        elif kind == "grad":
            state.params[index].grad = value
        elif state.optimizer is not None:
            state.optimizer.state[state.params[index]][key[2]] = value

    def keep_rng(self) -> list[torch.Tensor]:
        """The RNG states (CPU, and the GPU's on CUDA), kept in the host arena
        rather than the allocator the device-tier measures watch."""
        states = [torch.get_rng_state()]
        if not self.tier.simulated:
            states.append(torch.cuda.get_rng_state(self.tier.device))
        homes = []
        for state in states:
            home = self.scratch.slot(state)
            home.copy_(state)
            homes.append(home)
        return homes

    def restore_rng(self, states: list[torch.Tensor]) -> None:
        # The generators read a state from the start of its own storage.
        torch.set_rng_state(states[0].clone())
        if len(states) > 1:
            torch.cuda.set_rng_state(states[1].clone(), self.tier.device)

    def load_boundary(self, host: torch.Tensor, key: Hashable) -> torch.Tensor:
        self.ledger.place(key, DEVICE, tensor_bytes(host))
        self.traffic.to_device += tensor_bytes(host)
        return self.tier.to_device(host)

    # --- activations autograd keeps -----------------------------------------

    @contextmanager
    def saving(self, boundary: torch.Tensor) -> Iterator[None]:
        """Charge what autograd saves, once per storage, unless it is already
        charged (the group's parameters and buffers, its input)."""
        resident = {storage_key(t) for _, t in self.every_device_tensor()}
        resident.add(storage_key(boundary))

        def pack(tensor: torch.Tensor) -> torch.Tensor:
            key = storage_key(tensor)
            if key not in resident and key not in self.saved:
                self.saved.add(key)
                self.ledger.place(("saved", key), DEVICE, tensor.untyped_storage().nbytes())
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            yield

    def release_saved(self) -> None:
        for key in self.saved:
            self.ledger.drop(("saved", key))
        self.saved.clear()

    def every_device_tensor(self) -> Iterator[tuple[Key, torch.Tensor]]:
        for state in self.groups:
            for key, tensor in self.resident_tensors(state, grads=True, optimizer=True):
                if self.ledger.tier_of(self.ledger_key(state, key)) == DEVICE:
                    yield key, tensor

    def check(self) -> None:
        """Every tracked tensor is in exactly one tier, where the ledger says."""
        self.ledger.check()
        for state in self.groups:
            for key, tensor in self.resident_tensors(state, grads=True, optimizer=True):
                tier = self.ledger.tier_of(self.ledger_key(state, key))
                in_arena = storage_key(tensor) in self.arena_keys
                if tier is None or (tier == HOST) != in_arena:
                    raise AssertionError(
                        f"group {state.index} {key}: ledger says {tier}, storage is "
                        f"{'host arena' if in_arena else 'device'}"
                    )


def budget_from_environment() -> int:
    """The worker's device-memory budget, as the operator sets it."""
    raw = os.environ.get(contract.ENV_GPU_MEMORY_BUDGET, "")
    try:
        budget = int(raw)
    except ValueError:
        budget = 0
    if budget < 1:
        raise BudgetTooSmall(
            f"{contract.ENV_GPU_MEMORY_BUDGET}: got {raw!r}; expected a positive number of bytes"
        )
    return budget


def tensor_bytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()
