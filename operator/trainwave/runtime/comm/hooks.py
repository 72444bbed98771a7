"""Gradient compression and hierarchical allreduce, registered on a DDP model.

The hooks themselves are torch's (torch.distributed.algorithms.ddp_comm_hooks:
fp16/bf16 casting, PowerSGD) and ours (hierarchical.py). This module only picks
the combination and says, for the report, what it did and what it did not.

Combinations: fp16/bf16 compose with hierarchical allreduce (the three phases
carry the narrow dtype). PowerSGD does not: what it sends are two small factor
matrices per layer, already too little for the node-first detour to pay, so
hierarchical is reported "skipped" beside it.

PowerSGD on gloo runs one bucket at a time on a worker thread: its callbacks
block on further collectives inside gloo's own (two) threads, and with several
buckets in flight every gloo thread ends up waiting on work no thread is left to
run. (The annotations stay evaluated: DDP checks a hook's `bucket` annotation.)
"""

import importlib.util
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import GradBucket
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel

from trainwave import contract
from trainwave.runtime.comm.hierarchical import (
    HierarchicalState,
    NodeGroups,
    hierarchical_allreduce_hook,
)

# "auto" is resolved by the caller (strategy.py) before it gets here.
HOOK_MODES = tuple(m for m in contract.COMPRESSION_MODES if m != "auto")
_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class PowerSGDOptions:
    """PowerSGD knobs; torch's guidance: start after ~10% of training, rank 1-4."""

    rank: int = 1
    start_iter: int = 1000
    error_feedback: bool = True
    warm_start: bool = True

    def __post_init__(self) -> None:
        if self.rank < 1:
            raise ValueError(f"PowerSGD rank must be >= 1, got {self.rank}")
        if (self.error_feedback or self.warm_start) and self.start_iter < 2:
            raise ValueError(
                f"PowerSGD start_iter={self.start_iter}: must be >= 2 with error feedback or "
                "warm start (the first step's gradients seed them)"
            )


@dataclass
class SerialState:
    """Runs another hook's buckets one after the other on a single worker thread."""

    inner_state: object
    inner_hook: Callable[[Any, GradBucket], torch.futures.Future[torch.Tensor]]
    _worker: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="trainwave-serial")
    )

    def close(self) -> None:
        self._worker.shutdown(wait=True)


def serial_hook(state: SerialState, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: the inner hook, its bucket finished before the next one starts."""
    result: torch.futures.Future[torch.Tensor] = torch.futures.Future()

    def run() -> None:
        try:
            value = state.inner_hook(state.inner_state, bucket).wait()
        except Exception as exc:  # handed to DDP, which raises it in backward
            result.set_exception(exc)  # type: ignore[arg-type]  # torch's stub is wrong
        else:
            result.set_result(value)

    state._worker.submit(run)
    return result


@dataclass
class RegisteredHook:
    """What was registered, kept so the caller can inspect or close it."""

    report: dict[str, str]
    state: object | None  # the hook's own state (PowerSGD's, not its serializing wrapper)
    _closers: list[Callable[[], None]] = field(default_factory=list)

    def close(self) -> None:
        """Stop the hook's worker threads, if it has any."""
        for close in self._closers:
            close()


@dataclass
class BuiltHook:
    """A hook and its state, not yet registered; `hook` None: DDP's own allreduce."""

    report: dict[str, str]
    state: object | None
    hook: Callable[[Any, GradBucket], torch.futures.Future[torch.Tensor]] | None

    def close(self) -> None:
        """Stop the hook's worker threads, if it has any."""
        close = getattr(self.state, "close", None)
        if callable(close):
            close()


def build_comm_hook(
    backend: str,
    *,
    compression: str,
    groups: NodeGroups | None,
    powersgd: PowerSGDOptions | None = None,
) -> BuiltHook:
    """The hook for `compression` (off/fp16/bf16/powersgd), hierarchical when `groups`.

    `backend` is the process group's ("gloo", "nccl"). The report has the entries
    for "compression" and "hierarchical_allreduce".
    """
    if compression not in HOOK_MODES:
        raise ValueError(
            f"compression={compression!r} is not a hook mode; accepted: {', '.join(HOOK_MODES)}"
        )
    hier_state = "on" if groups is not None else "off"
    if compression == "powersgd" and importlib.util.find_spec("numpy") is None:
        missing = "skipped: torch's PowerSGD hook needs numpy, which is not installed"
        return BuiltHook({"compression": missing, "hierarchical_allreduce": hier_state}, None, None)
    if compression == "powersgd":
        opts = powersgd or PowerSGDOptions()
        state = powerSGD_hook.PowerSGDState(
            process_group=None,
            matrix_approximation_rank=opts.rank,
            start_powerSGD_iter=opts.start_iter,
            use_error_feedback=opts.error_feedback,
            warm_start=opts.warm_start,
        )
        detail = ""
        built = BuiltHook({}, state, powerSGD_hook.powerSGD_hook)
        if backend == "gloo":
            built = BuiltHook({}, SerialState(state, powerSGD_hook.powerSGD_hook), serial_hook)
            detail = ", one bucket at a time (gloo)"
        if groups is not None:
            hier_state = (
                "skipped: PowerSGD sends low-rank factors; hierarchical applies to full gradients"
            )
        built.report = {
            "compression": f"on: powersgd rank {opts.rank} from step {opts.start_iter}{detail}",
            "hierarchical_allreduce": hier_state,
        }
        return built
    dtype = _DTYPES.get(compression)
    if groups is not None:
        hstate = HierarchicalState(groups, compress_dtype=dtype)
        detail = f"on: {groups.nodes} nodes x {groups.local_world_size} local ranks"
        compressed = f"on: {compression}" if dtype else "off"
        report = {"compression": compressed, "hierarchical_allreduce": detail}
        return BuiltHook(report, hstate, hierarchical_allreduce_hook)
    if dtype is None:
        return BuiltHook({"compression": "off", "hierarchical_allreduce": "off"}, None, None)
    hook = (
        default_hooks.fp16_compress_hook
        if compression == "fp16"
        else default_hooks.bf16_compress_hook
    )
    report = {"compression": f"on: {compression}", "hierarchical_allreduce": "off"}
    return BuiltHook(report, None, hook)


def register_comm_hook(
    model: DistributedDataParallel,
    *,
    compression: str,
    groups: NodeGroups | None,
    powersgd: PowerSGDOptions | None = None,
) -> RegisteredHook:
    """Build the hook for `compression` (see build_comm_hook) and register it on `model`."""
    built = build_comm_hook(
        dist.get_backend(model.process_group),
        compression=compression,
        groups=groups,
        powersgd=powersgd,
    )
    if built.hook is None:
        return RegisteredHook(built.report, built.state)
    try:
        model.register_comm_hook(built.state, built.hook)
    except TypeError as exc:  # torch refuses bf16 without NCCL >= 2.10 (CPU-only builds)
        built.close()
        skipped = {"compression": f"skipped: {exc}", "hierarchical_allreduce": "off"}
        return RegisteredHook(skipped, None)
    state = built.state.inner_state if isinstance(built.state, SerialState) else built.state
    return RegisteredHook(built.report, state, [built.close])
