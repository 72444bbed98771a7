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
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.optim import Optimizer

from trainwave import contract
from trainwave.runtime import telemetry
from trainwave.runtime.checkpoint import Checkpointer
from trainwave.runtime.comm.autocomm import MeasuredComm
from trainwave.runtime.comm.distributing import Distributor, env_int
from trainwave.runtime.comm.hooks import PowerSGDOptions, RegisteredHook
from trainwave.runtime.comm.process_group import join_from_env
from trainwave.runtime.comm.strategy import Choice
from trainwave.runtime.comm.trials import TrialOptions
from trainwave.runtime.settings import Settings, load_settings
from trainwave.runtime.train import features
from trainwave.runtime.train.budget import Held, LossFn, first_batch, hold_to_budget
from trainwave.runtime.train.gang_checkpoint import resume_gang, save_gang

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
    "checkpoint": "auto",  # on when a checkpoint directory is configured
    "submodel": "auto",  # acts only with a device-memory budget (shared GPUs): budget.py
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
        checkpointer: Checkpointer | None = None,
        device: torch.device | str | None = None,
        settings: Settings | None = None,
    ) -> None:
        if gradient_accumulation_steps < 1:
            raise ValueError(
                f"gradient_accumulation_steps must be >= 1, got {gradient_accumulation_steps}"
            )
        self.modes = _check_modes(modes or {})
        self.accumulation_steps = gradient_accumulation_steps
        self.amp_dtype = amp_dtype
        self.powersgd = powersgd or PowerSGDOptions()
        self.trial_options = trials or TrialOptions()
        self.device = torch.device(device) if device is not None else _default_device()
        self.report: dict[str, str] = {}
        self.distributor = Distributor(
            self.modes,
            self.report,
            local_world_size=local_world_size,
            inter_node_gbps=inter_node_gbps,
            intra_node_gbps=intra_node_gbps,
            static_graph=static_graph,
            powersgd=self.powersgd,
            trial_options=self.trial_options,
            device=self.device,
        )
        self.scaler: torch.amp.GradScaler | None = None
        self.sync_gradients = True
        self._micro_step = 0
        self.optimizer_steps = 0  # synchronized steps taken, counting those resumed from
        self._saved_at: int | None = None
        self.checkpointer = checkpointer
        self._settings = settings  # set: prepare() joins the job's process group from env
        self._model: Any = None
        self._optimizer: Optimizer | None = None
        self._prepared: PreparedOptimizer | None = None
        self._loader: Any = None
        self._loss_fn: LossFn | None = None
        self.held = Held()  # what the device-memory budget made of this job (budget.py)

    @classmethod
    def from_settings(cls, settings: Settings, **options: Any) -> Accelerator:
        """Configured by the worker's TRAINWAVE_* environment; explicit `options` win over it.

        Feature modes (TRAINWAVE_FEATURE_*), link rates for `auto`
        (TRAINWAVE_INTER_NODE_GBPS, TRAINWAVE_INTRA_NODE_GBPS), LOCAL_WORLD_SIZE, and
        checkpoints (TRAINWAVE_CHECKPOINT_DIR, _EVERY_STEPS, _KEEP). prepare() also
        joins the process group from env:// when WORLD_SIZE > 1 and none exists.
        """
        modes = {n: m for n, m in settings.features.items() if n in DEFAULT_MODES}
        options.setdefault("modes", modes)
        options.setdefault("inter_node_gbps", settings.inter_node_gbps)
        options.setdefault("intra_node_gbps", settings.intra_node_gbps)
        options.setdefault("local_world_size", settings.identity.local_world_size)
        options.setdefault("checkpointer", Checkpointer.from_settings(settings))
        return cls(settings=settings, **options)

    # -- prepare ---------------------------------------------------------------
    def prepare(
        self,
        model: torch.nn.Module,
        optimizer: Optimizer,
        loader: Any = None,
        *,
        loss_fn: LossFn | None = None,
        sample: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[Any, PreparedOptimizer, Any]:
        """`loss_fn` and `sample` (default: the loader's first batch) let a shared-GPU
        worker train through the submodel allocator; use train_step(inputs, targets)."""
        if self._settings is not None:
            joined = join_from_env(self._settings, self.device)
            if joined:
                self.report["process_group"] = joined
        self.report["checkpoint"] = self._checkpoint_state()
        self._loss_fn = loss_fn
        # Before the model moves: the executor keeps it in host memory, group by group.
        self.held = hold_to_budget(
            model,
            optimizer,
            self._settings or load_settings(os.environ),
            self.modes["submodel"],
            loss_fn=_scaled(loss_fn, self.accumulation_steps),
            sample=sample if sample is not None else first_batch(loader),
            world_size=dist.get_world_size()
            if dist.is_available() and dist.is_initialized()
            else 1,
        )
        self.report.update(self.held.report)
        if self.held.executor is not None:
            why = "skipped: the submodel executor trains this model (one optimizer per group)"
            for name in ("amp", "fused_optimizer", "compile", "cuda_graphs"):
                self.report[name] = why if self.modes[name] != "off" else "off"
            self._model, self._optimizer, self._loader = model, optimizer, loader
            self._prepared = PreparedOptimizer(optimizer, self)
            return model, self._prepared, loader
        model.to(self.device)
        self.report["compute_time"] = self._watch_compute(model)
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
        wrapped: Any = self.distributor.wrap(model)
        wrapped, compiled = features.compile_model(
            wrapped, self.modes["compile"], self.modes["cuda_graphs"], self.device
        )
        self.report.update(compiled)
        self._model, self._optimizer, self._loader = wrapped, optimizer, loader
        self._prepared = PreparedOptimizer(optimizer, self)
        return wrapped, self._prepared, loader

    def _watch_compute(self, model: torch.nn.Module) -> str:
        """Time the inner model's forward (before any wrapper: DDP's own forward syncs
        buffers) for the progress reports' compute_seconds, the straggler signal."""
        if self._settings is not None and self._settings.feature("telemetry") == "off":
            return "off: telemetry is off"
        telemetry.watch(model)
        return "on: forward of the inner model, in progress reports (compute_seconds)"

    def train_step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """One micro-batch: forward, loss_fn, backward, and at the end of the accumulation
        window the optimizer step; through the submodel executor when prepare() chose it.
        Returns the loss (detached; under accumulation, divided by the window on the
        executor's path, as backward() divides it on the plain one)."""
        if self._loss_fn is None or self._prepared is None:
            raise RuntimeError("train_step() needs prepare(model, optimizer, loader, loss_fn=...)")
        executor = self.held.executor
        with self.accumulate():
            if executor is not None:
                loss = executor.step(inputs, targets, apply=self.sync_gradients)
                if self.sync_gradients:
                    self.optimizer_steps += 1
                return loss
            out = self._model(inputs.to(self.device))
            loss = self._loss_fn(out, targets.to(self.device))
            self.backward(loss)
            self._prepared.step()
            self._prepared.zero_grad()
        return loss.detach()

    # -- checkpoints ---------------------------------------------------------------
    def save_checkpoint(
        self,
        step: int | None = None,
        *,
        force: bool = False,
        extra: Mapping[str, Any] | None = None,
    ) -> Path | None:
        """Checkpoint when due (every TRAINWAVE_CHECKPOINT_EVERY_STEPS optimizer steps) or forced.

        Call it on every rank after every micro-batch or step (it gathers each
        rank's RNG state). `step` defaults to the optimizer steps taken so far;
        a step is written once however often this is called. Rank 0 writes and
        gets the path; None when nothing was written.
        """
        step = self.optimizer_steps if step is None else step
        if self.checkpointer is None or step == self._saved_at:
            return None
        if not (force or self.checkpointer.due(step)):
            return None
        self._saved_at = step
        return save_gang(
            self.checkpointer,
            step,
            model=self._prepared_model("save_checkpoint"),
            optimizer=self._optimizer,
            scaler=self.scaler,
            sampler=_stateful_sampler(self._loader),
            extra=extra,
        )

    def resume(self) -> int:
        """Load the newest checkpoint on every rank; returns its optimizer steps (0: none)."""
        if self.checkpointer is None:
            return 0
        self.optimizer_steps = resume_gang(
            self.checkpointer,
            model=self._prepared_model("resume"),
            optimizer=self._optimizer,
            scaler=self.scaler,
            sampler=_stateful_sampler(self._loader),
            device=self.device,
        )
        self._saved_at = self.optimizer_steps
        return self.optimizer_steps

    def _prepared_model(self, caller: str) -> torch.nn.Module:
        if self._model is None:
            raise RuntimeError(f"call prepare(model, optimizer, loader) before {caller}()")
        return self._model  # type: ignore[no-any-return]

    def _checkpoint_state(self) -> str:
        c, mode = self.checkpointer, self.modes["checkpoint"]
        if c is not None:
            every = f"every {c.every_steps} steps" if c.every_steps else "when forced"
            return f"on: {every} into {c.directory}, keep {c.keep}; save_checkpoint(step), resume()"
        if mode == "off":
            return "off"
        if mode == "on":
            return f"skipped: {contract.ENV_CHECKPOINT_DIR} is not set"
        return f"off: no checkpoint directory ({contract.ENV_CHECKPOINT_DIR})"

    # What the distributor did, where scripts and benchmarks look for it.
    @property
    def ddp(self) -> DistributedDataParallel | None:
        return self.distributor.ddp

    @property
    def hook(self) -> RegisteredHook | None:
        return self.distributor.hook

    @property
    def auto_comm(self) -> MeasuredComm | None:
        return self.distributor.auto_comm

    @property
    def comm_choice(self) -> Choice | None:
        return self.distributor.comm_choice

    def close(self) -> None:
        """Stop the comm hooks' worker threads (hierarchical, PowerSGD on gloo) and give
        back an arbiter grant; optional (a process that exits gives both back)."""
        self.distributor.close()
        self.held.close()

    # -- the training loop -------------------------------------------------------
    def backward(self, loss: torch.Tensor) -> None:
        """loss.backward(), averaged over the accumulation window and scaled for fp16."""
        if self.held.executor is not None:
            raise RuntimeError(
                "this job trains through the submodel allocator (report['submodel']): its "
                "executor runs forward and backward group by group; call "
                "train_step(inputs, targets) instead of model(...) and backward(loss)"
            )
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


class PreparedOptimizer:
    """The user's optimizer, stepping only when gradients were synchronized."""

    def __init__(self, optimizer: Optimizer, accelerator: Accelerator) -> None:
        self.optimizer = optimizer
        self._acc = accelerator

    def step(self, closure: Any = None) -> Any:
        if not self._acc.sync_gradients or self._acc.held.executor is not None:
            # The executor stepped each group's own optimizer while it was resident.
            return None
        scaler = self._acc.scaler
        if scaler is not None:
            out = scaler.step(self.optimizer)
            scaler.update()
        else:
            out = self.optimizer.step(closure)
        self._acc.optimizer_steps += 1
        self._acc.distributor.step_done()
        return out

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self._acc.sync_gradients:
            self.optimizer.zero_grad(set_to_none=set_to_none)

    def __getattr__(self, name: str) -> Any:
        # param_groups, state, state_dict(), load_state_dict(): the optimizer's own.
        return getattr(self.optimizer, name)


def _stateful_sampler(loader: Any) -> object | None:
    """The loader's (batch) sampler when it can save its position, so a resume skips no data."""
    for name in ("batch_sampler", "sampler"):
        sampler = getattr(loader, name, None)
        if callable(getattr(sampler, "state_dict", None)):
            return sampler
    return None


def _scaled(loss_fn: LossFn | None, steps: int) -> LossFn | None:
    """The executor runs backward itself: averaging over the window goes into its loss."""
    if loss_fn is None or steps == 1:
        return loss_fn
    return lambda out, target: loss_fn(out, target) / steps


def _default_device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", env_int(contract.ENV_LOCAL_RANK) or 0)
    return torch.device("cpu")


# -- module-level API: one accelerator per process ---------------------------------
_current: dict[str, Accelerator] = {}  # "this process" -> its accelerator


def prepare(
    model: torch.nn.Module,
    optimizer: Optimizer,
    loader: Any = None,
    *,
    loss_fn: LossFn | None = None,
    sample: tuple[torch.Tensor, torch.Tensor] | None = None,
    **options: Any,
) -> tuple[Any, PreparedOptimizer, Any]:
    """This process's Accelerator from the worker's environment (`options` win); prepare all three.

    See Accelerator.from_settings for what the environment sets, Accelerator.prepare for
    `loss_fn` and `sample`.
    """
    acc = Accelerator.from_settings(load_settings(os.environ), **options)
    _current["process"] = acc
    return acc.prepare(model, optimizer, loader, loss_fn=loss_fn, sample=sample)


def train_step(inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return current().train_step(inputs, targets)


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


def save_checkpoint(step: int | None = None, *, force: bool = False) -> Path | None:
    return current().save_checkpoint(step, force=force)


def resume() -> int:
    return current().resume()


__all__ = [
    "Accelerator",
    "PreparedOptimizer",
    "accumulate",
    "backward",
    "current",
    "prepare",
    "resume",
    "save_checkpoint",
    "train_step",
]
