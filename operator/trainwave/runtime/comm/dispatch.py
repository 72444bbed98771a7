"""One DDP comm hook that hands each bucket to whichever strategy is active.

DDP accepts a communication hook once per model, but `auto` must try several
strategies on the live model and then keep one. So DDP gets this dispatcher,
and the trial driver switches `active` between synchronized steps, never
inside one: DDP waits for every bucket's future before backward() returns, so
at the switch no bucket of the old strategy is in flight, and each step's
buckets are all reduced by exactly one strategy, exactly once.

Stateful strategies keep their state across switches. PowerSGD counts its own
iterations to know when compression starts; here its count is set to the
training step each time it becomes active, so it compresses from the same step
as if it had been registered alone. Its error-feedback residual stays in its
state while other strategies run; if PowerSGD is not chosen, the state (and
with it the residual of its trial steps) is dropped, as a PowerSGD without
error feedback would have dropped it.

(The annotations stay evaluated: DDP checks a hook's `bucket` annotation.)
"""

from dataclasses import dataclass, field

import torch
from torch._C._distributed_c10d import GradBucket
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

from trainwave.runtime.comm.hooks import BuiltHook, SerialState


def _powersgd_state(built: BuiltHook) -> powerSGD_hook.PowerSGDState | None:
    state = built.state
    if isinstance(state, SerialState):
        state = state.inner_state
    return state if isinstance(state, powerSGD_hook.PowerSGDState) else None


@dataclass
class DispatchState:
    """The strategies DDP's buckets can go to, the active one, and what each step did."""

    hooks: dict[str, BuiltHook]
    active: str
    # (strategy, buckets it reduced) per finished step while `record` is on: lets
    # tests check that no step was split, skipped or reduced twice.
    history: list[tuple[str, int]] = field(default_factory=list)
    record: bool = True
    _buckets: int = 0

    def __post_init__(self) -> None:
        if self.active not in self.hooks:
            raise ValueError(f"active strategy {self.active!r} is not one of {sorted(self.hooks)}")

    def activate(self, name: str, step: int) -> None:
        """Route the buckets of step `step` (0-based synchronized steps) to `name`."""
        if name not in self.hooks:
            raise ValueError(f"strategy {name!r} is not one of {sorted(self.hooks)}")
        if self.record:
            self.history.append((self.active, self._buckets))
        self._buckets = 0
        self.active = name
        psgd = _powersgd_state(self.hooks[name])
        if psgd is not None:
            psgd.iter = step

    def keep_only(self, name: str) -> None:
        """Drop (and close) every strategy but `name`; stop recording."""
        for other, built in list(self.hooks.items()):
            if other != name:
                built.close()
                del self.hooks[other]
        self.record = False

    def close(self) -> None:
        for built in self.hooks.values():
            built.close()


def dispatch_hook(state: DispatchState, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: the active strategy's hook, or DDP's allreduce for a strategy without one."""
    built = state.hooks[state.active]
    state._buckets += 1
    if built.hook is None:
        return default_hooks.allreduce_hook(None, bucket)  # type: ignore[arg-type]
    return built.hook(built.state, bucket)
