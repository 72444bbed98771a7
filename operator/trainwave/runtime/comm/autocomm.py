"""How `prepare()` settles gradient communication when compression or hierarchical is `auto`.

1. Plan: the strategies consistent with whichever feature is fixed; with link
   rates, the cost model (strategy.py) prunes them to the plausible few (the
   list comes from rank 0, as ranks probe slightly different device costs).
2. One candidate left: register it, done. Several: register the dispatcher
   (dispatch.py) and let the first synchronized steps of training time each
   candidate (trials.py), then keep the fastest. Training never pauses for
   this; the trial steps are ordinary steps, each reduced by one strategy.

The driver runs on every rank from the prepared optimizer's step(), where no
bucket is in flight; the only extra collectives are one small allreduce at each
agreement point.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from trainwave.runtime.comm import strategy
from trainwave.runtime.comm.dispatch import DispatchState, dispatch_hook
from trainwave.runtime.comm.hierarchical import NodeGroups
from trainwave.runtime.comm.hooks import BuiltHook, PowerSGDOptions, build_comm_hook
from trainwave.runtime.comm.trials import TrialOptions, Trials, prune, trial_order

AUTO_FEATURES = ("compression", "hierarchical_allreduce")


def candidates_for(compression: str, hierarchical: str) -> tuple[str, ...]:
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


def strategy_modes(name: str, compression: str) -> tuple[str, bool]:
    """(hook compression mode, hierarchical?) of a strategy; a fixed bf16 stays bf16."""
    if name.endswith("fp16"):
        comp = compression if compression in ("fp16", "bf16") else "fp16"
    else:
        comp = "powersgd" if name == "powersgd" else "off"
    return comp, name.startswith("hierarchical")


def with_auto(state: str, why: str) -> str:
    """A feature's report with auto's reason: "off: <why>" or "<on: ...> (<why>)"."""
    return f"off: {why}" if state == "off" else f"{state} ({why})"


def collective_latency(world: int, reps: int = 10) -> float:
    """Seconds per ring step of a tiny allreduce over the whole world: the alpha of the model."""
    tiny = torch.zeros(1)
    dist.all_reduce(tiny)  # the first one sets up connections
    start = time.perf_counter()
    for _ in range(reps):
        dist.all_reduce(tiny)
    return (time.perf_counter() - start) / reps / (2 * (world - 1))


@dataclass
class CommPlan:
    """What to measure (several candidates) or register (one), and what the model said."""

    candidates: list[str]
    compression: str  # the compression feature's mode: fixed, or "auto"
    pruned: list[str] = field(default_factory=list)
    model_choice: strategy.Choice | None = None
    note: str = ""  # why the list is what it is, for the report


def plan(
    model: torch.nn.Module,
    *,
    compression: str,
    hierarchical: str,
    world: int,
    local: int | None,
    rates: tuple[float, float] | None,
    powersgd: PowerSGDOptions,
    bucket_cap_mb: int,
    device: torch.device,
    options: TrialOptions,
) -> CommPlan:
    """The candidates for `auto` (at least one), the same list on every rank."""
    allowed = list(candidates_for(compression, hierarchical))
    if rates is None:
        return CommPlan(
            trial_order(allowed), compression, note="no link rates: every candidate is timed"
        )
    params = [p for p in model.parameters() if p.requires_grad]
    grad_bytes = sum(p.numel() * p.element_size() for p in params)
    layout_ok = local is not None and world % local == 0
    problem = strategy.CommProblem(
        nodes=world // local if layout_ok and local else world,
        local_world_size=local if layout_ok and local else 1,
        inter_node_gbps=rates[0],
        intra_node_gbps=rates[1],
        shapes=[tuple(p.shape) for p in params],
        powersgd_rank=powersgd.rank,
        buckets=max(1, math.ceil(grad_bytes / (bucket_cap_mb * 2**20))),
    )
    costs = measure_device_costs(device, collective_latency(world))
    choice = strategy.choose(problem, costs, candidates=allowed)
    keep, pruned = prune(choice.estimates, options)
    shared: list[object] = [keep or [choice.strategy], pruned]
    dist.broadcast_object_list(shared, src=0)
    keep, pruned = list(shared[0]), list(shared[1])  # type: ignore[call-overload]
    note = f"the cost model left out {', '.join(pruned)}" if pruned else ""
    return CommPlan(keep, compression, pruned, choice, note)


def _refused(ddp: DistributedDataParallel, built: BuiltHook) -> list[str]:
    """DDP's own verdict on a hook it never sees directly (bf16 needs CUDA and NCCL >= 2.10)."""
    check = getattr(ddp, "_check_comm_hook", None)
    if built.hook is None or not callable(check):
        return []
    try:
        check(built.hook)
    except (TypeError, ValueError) as exc:
        return [f"skipped: {exc}"]
    return []


class MeasuredComm:
    """Times each candidate on the live model and keeps the fastest (see module doc)."""

    def __init__(
        self,
        ddp: DistributedDataParallel,
        comm_plan: CommPlan,
        *,
        groups: NodeGroups | None,
        powersgd: PowerSGDOptions,
        options: TrialOptions,
        device: torch.device,
    ) -> None:
        self.plan, self.device = comm_plan, device
        backend = dist.get_backend(ddp.process_group)
        hooks: dict[str, BuiltHook] = {}
        self.unavailable: dict[str, str] = {}
        for name in comm_plan.candidates:
            comp, hier = strategy_modes(name, comm_plan.compression)
            built = build_comm_hook(
                backend, compression=comp, groups=groups if hier else None, powersgd=powersgd
            )
            skipped = [v for v in built.report.values() if v.startswith("skipped")]
            skipped += _refused(ddp, built)
            if skipped and name != "flat":  # e.g. PowerSGD without numpy: it would time flat
                self.unavailable[name] = skipped[0]
                built.close()
            else:
                hooks[name] = built
        if not hooks:  # every candidate refused (bf16 on a CPU-only build): DDP's own allreduce
            hooks["flat"] = build_comm_hook(backend, compression="off", groups=None)
        start = {"powersgd": powersgd.start_iter} if "powersgd" in hooks else {}
        self.trials = Trials(list(hooks), options, not_before=start)
        self.state = DispatchState(hooks, active=self.trials.current)
        ddp.register_comm_hook(self.state, dispatch_hook)
        self._world = dist.get_world_size()
        self._last = time.perf_counter()

    @property
    def settled(self) -> bool:
        return self.trials.chosen is not None and not self.trials.measuring

    def step_done(self) -> None:
        """After each synchronized optimizer step: time it, agree when due, switch."""
        if self.settled:
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # time the GPU's work, not the launch queue
        self.trials.finished(time.perf_counter() - self._last)
        if self.trials.due:
            names = self.trials.pending()
            if names:
                local = torch.tensor(
                    self.trials.local_medians(names), dtype=torch.float64, device=self.device
                )
                dist.all_reduce(local)
                self.trials.agree(names, (local / self._world).tolist())
            else:
                self.trials.agree([], [])
        self.state.activate(self.trials.current, self.trials.step)
        if self.settled:
            assert self.trials.chosen is not None
            self.state.keep_only(self.trials.chosen)
        self._last = time.perf_counter()

    def report(self, auto_features: tuple[str, ...]) -> dict[str, str]:
        """Report entries of the comm features: trial progress or the pick with its numbers.

        Features in `auto_features` get auto's story; the others (fixed by the
        user) get what the running strategy's hook does for them.
        """
        running = self.trials.chosen if self.settled else self.trials.current
        assert running is not None
        entries = dict(self.state.hooks[running].report)
        if not self.settled:
            opts = self.trials.options
            text = (
                f"auto: measuring {', '.join(self.trials.candidates)} ({opts.warmup_steps} "
                f"warm-up + {opts.timed_steps} timed steps each; step {self.trials.step} of "
                f"{self.trials.end}, now {running})"
            )
            entries.update(dict.fromkeys(auto_features, text + self._notes()))
            return entries
        measured = ", ".join(f"{n} {s * 1000:.0f}" for n, s in self.trials.agreed.items())
        why = f"auto: chose {running}; measured ms/step: {measured} ({self.trials.reason})"
        why += self._notes()
        for name in auto_features:
            entries[name] = with_auto(entries.get(name, "off"), why)
        return entries

    def _notes(self) -> str:
        notes = [self.plan.note] if self.plan.note else []
        notes += [f"{n} {why}" for n, why in self.unavailable.items()]
        return "".join(f"; {n}" for n in notes)

    def close(self) -> None:
        self.state.close()


def measure_device_costs(
    device: torch.device, collective_latency_s: float | None = None
) -> strategy.DeviceCosts:
    """A ~50 ms probe of the rates strategy.py weighs compression with, on this device.

    Measured while the other ranks do the same, so on a shared CPU the rates
    already reflect the contention training will see.
    """

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    x = torch.randn(2**21, device=device)  # 8 MiB of fp32
    a = torch.randn(256, 256, device=device)

    def best_of(fn: Callable[[], object], reps: int = 3) -> float:
        times = []
        for _ in range(reps):
            sync()
            start = time.perf_counter()
            fn()
            sync()
            times.append(time.perf_counter() - start)
        return max(min(times), 1e-9)

    cast = best_of(lambda: x.to(torch.float16))
    matmul = best_of(lambda: a @ a)
    copy = best_of(lambda: x.add(x))  # reads two buffers, writes one: what a reduction does
    default_latency = 2e-5 if device.type == "cuda" else 2e-4
    return strategy.DeviceCosts(
        cast_gbytes_per_s=x.numel() * 4 / cast / 1e9,
        matmul_gflops=2 * 256**3 / matmul / 1e9,
        collective_latency_s=default_latency
        if collective_latency_s is None
        else collective_latency_s,
        memory_gbytes_per_s=x.numel() * 4 / copy / 1e9,
    )
