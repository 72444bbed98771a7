"""The three-line API: `prepare(model, optimizer, loader)`, `backward(loss)`, `accumulate()`.

The shape is Accelerate's and Fabric's, so training scripts already written for
them read the same:

    model, optimizer, loader = prepare(model, optimizer, loader)
    for batch in loader:
        with accumulate():
            backward(loss_fn(model(batch)))
            optimizer.step()
            optimizer.zero_grad()

`prepare` applies what the feature modes allow (AMP, fused optimizer, DDP with
tuned buckets, compression and hierarchical allreduce, torch.compile and CUDA
graphs as opt-ins) and records each feature's state in `report`: "on: ...",
"off" or "skipped: <reason>". The returned optimizer steps only on the last
micro-batch of an accumulation window and applies the loss scaler when fp16
needs one, so the loop above is correct for every combination.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, nullcontext
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.optim import Optimizer

from trainwave import contract
from trainwave.runtime import features, strategy
from trainwave.runtime.comm import PowerSGDOptions, RegisteredHook, register_comm_hook
from trainwave.runtime.hierarchical import build_node_groups

# What a feature the caller did not mention defaults to. Lossy compression and
# the compilers change numbers or cost minutes of warm-up, so they are opt-in.
DEFAULT_MODES: Mapping[str, str] = {
    "amp": "auto",
    "fused_optimizer": "auto",
    "ddp_buckets": "auto",
    "compression": "off",
    "hierarchical_allreduce": "auto",
    "compile": "off",
    "cuda_graphs": "off",
}


def _check_modes(modes: Mapping[str, str]) -> dict[str, str]:
    out = dict(DEFAULT_MODES)
    for name, mode in modes.items():
        if name not in contract.RUNTIME_FEATURES:
            raise ValueError(
                f"unknown feature {name!r}; accepted: {', '.join(contract.RUNTIME_FEATURES)}"
            )
        accepted = contract.COMPRESSION_MODES if name == "compression" else contract.FEATURE_MODES
        if mode not in accepted:
            raise ValueError(f"feature {name}={mode!r}; accepted: {', '.join(accepted)}")
        out[name] = mode
    return out


class Accelerator:
    """Holds what prepare() decided, for backward() and accumulate() to act on."""

    def __init__(
        self,
        modes: Mapping[str, str] | None = None,
        *,
        gradient_accumulation_steps: int = 1,
        inter_node_gbps: float | None = None,
        intra_node_gbps: float | None = None,
        local_world_size: int | None = None,
        amp_dtype: str | None = None,
        static_graph: bool = False,
        powersgd: PowerSGDOptions | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        if gradient_accumulation_steps < 1:
            raise ValueError(
                f"gradient_accumulation_steps must be >= 1, got {gradient_accumulation_steps}"
            )
        self.modes = _check_modes(modes or {})
        self.accumulation_steps = gradient_accumulation_steps
        self.inter_node_gbps, self.intra_node_gbps = inter_node_gbps, intra_node_gbps
        self.local_world_size = local_world_size
        self.amp_dtype, self.static_graph = amp_dtype, static_graph
        self.powersgd = powersgd or PowerSGDOptions()
        self.device = torch.device(device) if device is not None else _default_device()
        self.report: dict[str, str] = {}
        self.ddp: DistributedDataParallel | None = None
        self.hook: RegisteredHook | None = None
        self.comm_choice: strategy.Choice | None = None  # what `auto` picked, with its estimates
        self._bucket_cap_mb = 25  # DDP's default, until _distribute sets it
        self.scaler: torch.amp.GradScaler | None = None
        self.sync_gradients = True
        self._micro_step = 0

    # -- prepare ---------------------------------------------------------------
    def prepare(
        self, model: torch.nn.Module, optimizer: Optimizer, loader: Any = None
    ) -> tuple[Any, PreparedOptimizer, Any]:
        model.to(self.device)
        amp, needs_scaler, self.report["amp"] = features.choose_amp(
            self.modes["amp"], self.device, self.amp_dtype
        )
        if amp is not None:
            features.autocast_forward(model, self.device.type, amp)
        if needs_scaler:
            self.scaler = torch.amp.GradScaler(self.device.type)
        optimizer, self.report["fused_optimizer"] = features.faster_optimizer(
            optimizer, self.device, self.modes["fused_optimizer"]
        )
        wrapped: Any = self._distribute(model)
        wrapped = self._compile(wrapped)
        return wrapped, PreparedOptimizer(optimizer, self), loader

    def _distribute(self, model: torch.nn.Module) -> torch.nn.Module:
        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        if world == 1:
            why = "skipped: single process (torch.distributed not initialized or world size 1)"
            for name in ("ddp_buckets", "compression", "hierarchical_allreduce"):
                self.report[name] = why if self.modes[name] != "off" else "off"
            return model
        grad_bytes = sum(
            p.numel() * p.element_size() for p in model.parameters() if p.requires_grad
        )
        kwargs: dict[str, Any] = {}
        self._bucket_cap_mb = 25
        if self.modes["ddp_buckets"] == "off":
            self.report["ddp_buckets"] = "off: torch defaults"
        else:
            kwargs = {
                "bucket_cap_mb": strategy.bucket_cap_mb(grad_bytes),
                "gradient_as_bucket_view": True,
                "static_graph": self.static_graph,
            }
            self._bucket_cap_mb = kwargs["bucket_cap_mb"]
            self.report["ddp_buckets"] = (
                f"on: bucket_cap_mb={kwargs['bucket_cap_mb']} for {grad_bytes / 2**20:.1f} MiB of "
                f"gradients, gradient_as_bucket_view, static_graph={self.static_graph}"
                + ("" if self.static_graph else " (pass static_graph=True when the graph is fixed)")
            )
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        self.ddp = DistributedDataParallel(model, device_ids=device_ids, **kwargs)
        compression, hierarchical = self._comm_plan(model, world)
        groups = None
        if hierarchical:
            assert self.local_world_size is not None  # _comm_plan checked it
            groups = build_node_groups(self.local_world_size)
        self.hook = register_comm_hook(
            self.ddp, compression=compression, groups=groups, powersgd=self.powersgd
        )
        # A report of "off" from the hook keeps the reason _comm_plan found for it.
        for name, state in self.hook.report.items():
            if not (state == "off" and self.report.get(name, "").startswith(("off", "skipped"))):
                self.report[name] = state
        return self.ddp

    def _comm_plan(self, model: torch.nn.Module, world: int) -> tuple[str, bool]:
        """(compression hook mode, hierarchical?) — the same answer on every rank."""
        comp, hier = self.modes["compression"], self.modes["hierarchical_allreduce"]
        local = self.local_world_size or _env_int(contract.ENV_LOCAL_WORLD_SIZE)
        self.local_world_size = local
        hier_possible = None
        if hier != "off":
            if local is None:
                hier_possible = f"skipped: {contract.ENV_LOCAL_WORLD_SIZE} is not set"
            elif local == 1 or local >= world or world % local:
                hier_possible = (
                    f"skipped: {world} ranks as {local} per node have no two-level layout"
                )
        if hier_possible:
            self.report["hierarchical_allreduce"] = hier_possible
            hier = "off"
        if "auto" not in (comp, hier):
            return ("off" if comp == "off" else comp), hier == "on"
        if self.inter_node_gbps is None or self.intra_node_gbps is None:
            why = (
                f"off: auto needs link rates ({contract.ENV_INTER_NODE_GBPS}, "
                f"{contract.ENV_INTRA_NODE_GBPS}); none given"
            )
            self.report.update(
                {
                    k: why
                    for k, m in (("compression", comp), ("hierarchical_allreduce", hier))
                    if m == "auto"
                }
            )
            return ("off" if comp == "auto" else comp), hier == "on"
        grad_bytes = sum(
            p.numel() * p.element_size() for p in model.parameters() if p.requires_grad
        )
        layout_ok = local is not None and world % local == 0
        problem = strategy.CommProblem(
            nodes=world // local if layout_ok and local else world,
            local_world_size=local if layout_ok and local else 1,
            inter_node_gbps=self.inter_node_gbps,
            intra_node_gbps=self.intra_node_gbps,
            shapes=[tuple(p.shape) for p in model.parameters() if p.requires_grad],
            powersgd_rank=self.powersgd.rank,
            buckets=max(1, math.ceil(grad_bytes / (self._bucket_cap_mb * 2**20))),
        )
        costs = features.measure_device_costs(self.device, _collective_latency(world))
        choice = strategy.choose(problem, costs, candidates=_candidates(comp, hier))
        picked = [choice.strategy]
        dist.broadcast_object_list(picked, src=0)  # ranks measure slightly different costs
        choice = strategy.Choice(picked[0], choice.estimates, choice.reason)
        self.comm_choice = choice
        for name, mode in (("compression", comp), ("hierarchical_allreduce", hier)):
            if mode == "auto":
                self.report[name] = f"off: auto picked {choice.strategy} ({choice.reason})"
        compression = choice.compression if comp == "auto" else comp
        return compression, choice.hierarchical

    # -- the training loop -------------------------------------------------------
    def backward(self, loss: torch.Tensor) -> None:
        """loss.backward(), averaged over the accumulation window and scaled for fp16."""
        if self.accumulation_steps > 1:
            loss = loss / self.accumulation_steps
        if self.scaler is not None:
            self.scaler.scale(loss).backward()  # type: ignore[no-untyped-call]
        else:
            loss.backward()  # type: ignore[no-untyped-call]

    @contextmanager
    def accumulate(self) -> Iterator[None]:
        """One micro-batch; gradients are synchronized only on the window's last one."""
        self._micro_step += 1
        self.sync_gradients = self._micro_step % self.accumulation_steps == 0
        ctx = (
            self.ddp.no_sync()
            if self.ddp is not None and not self.sync_gradients
            else nullcontext()
        )
        with ctx:
            yield

    def _compile(self, model: Any) -> Any:
        cuda = self.device.type == "cuda"
        graphs, comp = self.modes["cuda_graphs"], self.modes["compile"]
        if graphs == "on" and not cuda:
            self.report["cuda_graphs"] = "skipped: no CUDA"
        elif graphs == "on":
            self.report["cuda_graphs"] = "on: torch.compile(mode='reduce-overhead')"
        else:
            self.report["cuda_graphs"] = (
                "off" if graphs == "off" else "off: opt-in (cuda_graphs=on)"
            )
        with_graphs = graphs == "on" and cuda
        if comp == "auto":
            self.report["compile"] = "off: opt-in (compile=on)"
        elif comp == "off":
            self.report["compile"] = "off"
        if comp != "on" and not with_graphs:
            return model
        missing = features.compile_backend_missing(self.device)
        if missing:
            for name in ("compile", "cuda_graphs"):
                if self.report.get(name, "").startswith("on") or self.modes[name] == "on":
                    self.report[name] = f"skipped: {missing}"
            return model
        mode = "reduce-overhead" if with_graphs else "default"
        if comp == "on":
            self.report["compile"] = f"on: torch.compile(mode={mode!r})"
        return torch.compile(model, mode=mode)


class PreparedOptimizer:
    """The user's optimizer, stepping only when gradients were synchronized."""

    def __init__(self, optimizer: Optimizer, accelerator: Accelerator) -> None:
        self.optimizer = optimizer
        self._acc = accelerator

    def step(self, closure: Any = None) -> Any:
        if not self._acc.sync_gradients:
            return None
        scaler = self._acc.scaler
        if scaler is not None:
            out = scaler.step(self.optimizer)
            scaler.update()
            return out
        return self.optimizer.step(closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self._acc.sync_gradients:
            self.optimizer.zero_grad(set_to_none=set_to_none)

    def __getattr__(self, name: str) -> Any:
        # param_groups, state, state_dict(), load_state_dict(): the optimizer's own.
        return getattr(self.optimizer, name)


def _collective_latency(world: int, reps: int = 10) -> float:
    """Seconds per ring step of a tiny allreduce over the whole world: the alpha of the model."""
    tiny = torch.zeros(1)
    dist.all_reduce(tiny)  # the first one sets up connections
    start = time.perf_counter()
    for _ in range(reps):
        dist.all_reduce(tiny)
    return (time.perf_counter() - start) / reps / (2 * (world - 1))


def _candidates(compression: str, hierarchical: str) -> tuple[str, ...]:
    """The strategies consistent with whichever of the two features is fixed."""
    comps = {"off": ("",), "fp16": ("fp16",), "bf16": ("fp16",), "powersgd": ("powersgd",)}
    allowed_comp = ("", "fp16", "powersgd") if compression == "auto" else comps[compression]
    allowed_hier = (False, True) if hierarchical == "auto" else (hierarchical == "on",)
    out = []
    for s in strategy.STRATEGIES:
        hier = s.startswith("hierarchical")
        comp = "fp16" if s.endswith("fp16") else "powersgd" if s == "powersgd" else ""
        if hier in allowed_hier and comp in allowed_comp:
            out.append(s)
    return tuple(out)


def _default_device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", _env_int(contract.ENV_LOCAL_RANK) or 0)
    return torch.device("cpu")


def _env_int(name: str) -> int | None:
    raw = os.environ.get(name)
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer") from None


# -- module-level API: one accelerator per process ---------------------------------
_current: dict[str, Accelerator] = {}  # "this process" -> its accelerator


def prepare(
    model: torch.nn.Module, optimizer: Optimizer, loader: Any = None, **options: Any
) -> tuple[Any, PreparedOptimizer, Any]:
    """Create this process's Accelerator from `options` and prepare the three objects."""
    acc = _current["process"] = Accelerator(**options)
    return acc.prepare(model, optimizer, loader)


def current() -> Accelerator:
    if "process" not in _current:
        raise RuntimeError(
            "call trainwave.runtime.accelerate.prepare(model, optimizer, loader) first"
        )
    return _current["process"]


def backward(loss: torch.Tensor) -> None:
    current().backward(loss)


def accumulate() -> Any:
    return current().accumulate()


__all__ = ["Accelerator", "PreparedOptimizer", "accumulate", "backward", "current", "prepare"]
