"""DDP around the model and the gradient communication the two comm features ask for.

`compression` and `hierarchical_allreduce` fixed: one hook is registered.
Either on `auto`: autocomm.py plans the candidates and, when more than one is
left, times them on the first training steps before keeping one. Every entry
this writes into the shared report says what was done and why.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from trainwave import contract
from trainwave.runtime.comm import autocomm, strategy
from trainwave.runtime.comm.hierarchical import NodeGroups, build_node_groups
from trainwave.runtime.comm.hooks import PowerSGDOptions, RegisteredHook, register_comm_hook
from trainwave.runtime.comm.trials import TrialOptions


class Distributor:
    """Wraps the model in DDP, registers the comm hook, and drives `auto`'s trials."""

    def __init__(
        self,
        modes: Mapping[str, str],
        report: dict[str, str],
        *,
        local_world_size: int | None,
        inter_node_gbps: float | None,
        intra_node_gbps: float | None,
        static_graph: bool,
        powersgd: PowerSGDOptions,
        trial_options: TrialOptions,
        device: torch.device,
    ) -> None:
        self.modes, self.report = modes, report  # the Accelerator's report, shared
        self.local_world_size = local_world_size
        self.inter_node_gbps, self.intra_node_gbps = inter_node_gbps, intra_node_gbps
        self.static_graph, self.powersgd = static_graph, powersgd
        self.trial_options, self.device = trial_options, device
        self.ddp: DistributedDataParallel | None = None
        self.hook: RegisteredHook | None = None
        self.comm_choice: strategy.Choice | None = None  # the cost model's view, with estimates
        self.auto_comm: autocomm.MeasuredComm | None = None  # auto's trials and its pick
        self._auto_features: tuple[str, ...] = ()
        self._bucket_cap_mb = 25  # DDP's default, until wrap() sets it

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """DDP around `model` with the comm hook the modes ask for; `model` itself if single."""
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
        local = self.local_world_size or env_int(contract.ENV_LOCAL_WORLD_SIZE)
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

    def step_done(self) -> None:
        """After each synchronized optimizer step: auto's trials advance."""
        if self.auto_comm is not None and not self.auto_comm.settled:
            self.auto_comm.step_done()
            self._merge_report(self.auto_comm.report(self._auto_features))

    def close(self) -> None:
        """Stop the comm hooks' worker threads (hierarchical, PowerSGD on gloo)."""
        if self.hook is not None:
            self.hook.close()
        if self.auto_comm is not None:
            self.auto_comm.close()


def env_int(name: str) -> int | None:
    """An integer variable of the environment, None when unset."""
    raw = os.environ.get(name)
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer") from None
