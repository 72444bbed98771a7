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

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, nullcontext
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.optim import Optimizer

from trainwave import contract
from trainwave.runtime import autocomm, features, strategy
from trainwave.runtime.comm import PowerSGDOptions, RegisteredHook, register_comm_hook
from trainwave.runtime.hierarchical import NodeGroups, build_node_groups
from trainwave.runtime.trials import TrialOptions

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
        trials: TrialOptions | None = None,
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
        self.trial_options = trials or TrialOptions()
        self.device = torch.device(device) if device is not None else _default_device()
        self.report: dict[str, str] = {}
        self.ddp: DistributedDataParallel | None = None
        self.hook: RegisteredHook | None = None
        self.comm_choice: strategy.Choice | None = None  # the cost model's view, with estimates
        self.auto_comm: autocomm.MeasuredComm | None = None  # auto's trials and its pick
        self._auto_features: tuple[str, ...] = ()
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
        comp, hier = self._comm_modes(world)
        if "auto" not in (comp, hier):
            self._register(comp, hier == "on")
            return self.ddp
        rates = None
        if self.inter_node_gbps is not None and self.intra_node_gbps is not None:
            rates = (self.inter_node_gbps, self.intra_node_gbps)
        comm_plan = autocomm.plan(
            model,
            compression=comp,
            hierarchical=hier,
            world=world,
            local=self.local_world_size,
            rates=rates,
            powersgd=self.powersgd,
            bucket_cap_mb=self._bucket_cap_mb,
            device=self.device,
            options=self.trial_options,
        )
        self.comm_choice = comm_plan.model_choice
        if len(comm_plan.candidates) == 1:
            only = comm_plan.candidates[0]
            self._register(*autocomm.strategy_modes(only, comp))
            why = f"auto: {only} is the only candidate" + (
                f" ({comm_plan.note})" if comm_plan.note else ""
            )
            for name in self._auto_features:
                self.report[name] = autocomm.with_auto(self.report[name], why)
            return self.ddp
        uses_groups = any(autocomm.strategy_modes(c, comp)[1] for c in comm_plan.candidates)
        self.auto_comm = autocomm.MeasuredComm(
            self.ddp,
            comm_plan,
            groups=self._node_groups() if uses_groups else None,
            powersgd=self.powersgd,
            options=self.trial_options,
            device=self.device,
        )
        self._merge_report(self.auto_comm.report(self._auto_features))
        return self.ddp

    def _node_groups(self) -> NodeGroups:
        assert self.local_world_size is not None  # _comm_modes checked it
        return build_node_groups(self.local_world_size)

    def _register(self, compression: str, hierarchical: bool) -> None:
        assert self.ddp is not None
        groups = self._node_groups() if hierarchical else None
        self.hook = register_comm_hook(
            self.ddp, compression=compression, groups=groups, powersgd=self.powersgd
        )
        self._merge_report(self.hook.report)

    def _merge_report(self, entries: Mapping[str, str]) -> None:
        # A report of "off" from a hook keeps the reason _comm_modes found for it.
        for name, state in entries.items():
            if not (state == "off" and self.report.get(name, "").startswith(("off", "skipped"))):
                self.report[name] = state

    def _comm_modes(self, world: int) -> tuple[str, str]:
        """(compression mode, hierarchical mode), hierarchical "off" when the layout forbids it."""
        comp, hier = self.modes["compression"], self.modes["hierarchical_allreduce"]
        local = self.local_world_size or _env_int(contract.ENV_LOCAL_WORLD_SIZE)
        self.local_world_size = local
        if hier != "off":
            why = None
            if local is None:
                why = f"skipped: {contract.ENV_LOCAL_WORLD_SIZE} is not set"
            elif local == 1 or local >= world or world % local:
                why = f"skipped: {world} ranks as {local} per node have no two-level layout"
            if why:
                self.report["hierarchical_allreduce"] = why
                hier = "off"
        self._auto_features = tuple(
            n for n, m in (("compression", comp), ("hierarchical_allreduce", hier)) if m == "auto"
        )
        return comp, hier

    def _synced_step_done(self) -> None:
        """Called by the prepared optimizer after each synchronized step (auto's trials)."""
        if self.auto_comm is not None and not self.auto_comm.settled:
            self.auto_comm.step_done()
            self._merge_report(self.auto_comm.report(self._auto_features))

    def close(self) -> None:
        """Stop the comm hooks' worker threads (hierarchical, PowerSGD on gloo); optional."""
        if self.hook is not None:
            self.hook.close()
        if self.auto_comm is not None:
            self.auto_comm.close()

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
        else:
            out = self.optimizer.step(closure)
        self._acc._synced_step_done()
        return out

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self._acc.sync_gradients:
            self.optimizer.zero_grad(set_to_none=set_to_none)

    def __getattr__(self, name: str) -> Any:
        # param_groups, state, state_dict(), load_state_dict(): the optimizer's own.
        return getattr(self.optimizer, name)


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
