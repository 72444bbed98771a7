"""One rank of bench_comm.py, started inside an emulated node's network namespace.

Trains the benchmark model through trainwave's own `Accelerator` once per
strategy (fresh model, same seed), and on rank 0 reads the namespace's veth
counters around the timed steps: every byte on that link crossed "nodes".
Rank 0 writes one JSON document to --out.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import signal
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "operator")]

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from trainwave.runtime.accelerate import Accelerator  # noqa: E402
from trainwave.runtime.comm.hierarchical import build_node_groups  # noqa: E402
from trainwave.runtime.comm.hooks import PowerSGDOptions  # noqa: E402

# name: (feature modes, accumulation steps)
STRATEGIES = {
    "flat": ({"compression": "off", "hierarchical_allreduce": "off"}, 1),
    "hierarchical": ({"compression": "off", "hierarchical_allreduce": "on"}, 1),
    "fp16": ({"compression": "fp16", "hierarchical_allreduce": "off"}, 1),
    "hierarchical+fp16": ({"compression": "fp16", "hierarchical_allreduce": "on"}, 1),
    "powersgd": ({"compression": "powersgd", "hierarchical_allreduce": "off"}, 1),
    "flat, accumulate 4": ({"compression": "off", "hierarchical_allreduce": "off"}, 4),
    "hierarchical, accumulate 4": ({"compression": "off", "hierarchical_allreduce": "on"}, 4),
}
POWERSGD = PowerSGDOptions(rank=1, start_iter=2)  # compress from the third step on


def log(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} rank {dist.get_rank()}: {message}", flush=True)


def make_model(width: int, layers: int) -> torch.nn.Module:
    torch.manual_seed(0)
    mods: list[torch.nn.Module] = []
    for _ in range(layers):
        mods += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*mods)


def link_bytes(iface: str) -> tuple[int, int]:
    """(tx, rx) of `iface` in this process's network namespace."""
    for line in Path("/proc/self/net/dev").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name.strip() == iface:
            fields = rest.split()
            return int(fields[8]), int(fields[0])
    raise RuntimeError(f"interface {iface} not found in /proc/self/net/dev")


def calibrate(args: argparse.Namespace, grad_bytes: int) -> dict[str, float]:
    """Effective ring rates (Gbit/s) of one node's loopback and of the emulated link."""
    groups = build_node_groups(args.local)
    x = torch.ones(grad_bytes // 4)
    rates = {}
    for name, group, runs in (
        ("intra", groups.intra, True),
        ("inter", groups.inter, args.local_rank == 0),
    ):
        size = dist.get_world_size(group)
        best = float("inf")
        for _ in range(3):
            dist.barrier()
            if runs:
                start = time.perf_counter()
                dist.all_reduce(x, group=group)
                best = min(best, time.perf_counter() - start)
        rates[name] = 2 * (size - 1) / size * grad_bytes * 8 / best / 1e9 if runs else 0.0
    tiny = torch.ones(1)
    start = time.perf_counter()
    for _ in range(20):
        dist.all_reduce(tiny, group=groups.intra)
    rates["latency_s"] = (time.perf_counter() - start) / 20 / max(1, 2 * (args.local - 1))
    dist.barrier()
    return rates


def run_strategy(args: argparse.Namespace, modes: dict, k: int) -> dict:
    acc = Accelerator(
        modes, gradient_accumulation_steps=k, local_world_size=args.local, powersgd=POWERSGD
    )
    model = make_model(args.width, args.layers)
    model, opt, _ = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=1e-3))
    gen = torch.Generator().manual_seed(dist.get_rank())
    x = torch.randn(args.batch, args.width, generator=gen)

    def step() -> None:
        for _ in range(k):
            with acc.accumulate():
                acc.backward(model(x).square().mean())
                opt.step()
                opt.zero_grad()

    for i in range(args.warmup):
        start = time.perf_counter()
        step()
        log(f"{modes} k={k} warm-up {i}: {time.perf_counter() - start:.3f} s")
    dist.barrier()
    before = link_bytes(args.iface)
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
        log(f"{modes} k={k} timed: {times[-1]:.3f} s")
    dist.barrier()
    after = link_bytes(args.iface)
    acc.close()
    return {
        "step_s_median": statistics.median(times),
        "step_s": times,
        "micro_batches_per_step": k,
        "node0_tx_bytes_per_step": (after[0] - before[0]) / args.steps,
        "node0_rx_bytes_per_step": (after[1] - before[1]) / args.steps,
        "report": {
            f: acc.report[f] for f in ("compression", "hierarchical_allreduce", "ddp_buckets")
        },
    }


def run_auto(args: argparse.Namespace, rates: dict[str, float]) -> dict:
    """prepare() with compression=auto, hierarchical=auto: train through its trials, then time it."""
    acc = Accelerator(
        {"compression": "auto", "hierarchical_allreduce": "auto"},
        local_world_size=args.local,
        inter_node_gbps=rates["inter"],
        intra_node_gbps=rates["intra"],
        powersgd=POWERSGD,
    )
    model = make_model(args.width, args.layers)
    model, opt, _ = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=1e-3))
    gen = torch.Generator().manual_seed(dist.get_rank())
    x = torch.randn(args.batch, args.width, generator=gen)

    def step() -> float:
        start = time.perf_counter()
        acc.backward(model(x).square().mean())
        opt.step()
        opt.zero_grad()
        return time.perf_counter() - start

    trial_steps = 0
    trial_start = time.perf_counter()
    while acc.auto_comm is not None and not acc.auto_comm.settled:
        trial_steps += 1
        log(f"auto trial step {trial_steps}: {step():.3f} s ({acc.report['compression'][:60]})")
        if trial_steps > 200:
            raise RuntimeError(f"auto did not settle in 200 steps: {acc.report['compression']}")
    trial_seconds = time.perf_counter() - trial_start
    times = [step() for _ in range(args.steps)]
    log(f"auto settled: {acc.report['compression']}; timed {times}")
    acc.close()
    choice, measured = acc.comm_choice, acc.auto_comm
    if choice is None or measured is None:
        raise RuntimeError(f"auto did not measure: {acc.report['compression']}")
    return {
        "strategy": measured.trials.chosen,
        "reason": measured.trials.reason,
        "trial_steps": trial_steps,
        "trial_seconds": trial_seconds,
        "measured_s": measured.trials.agreed,
        "candidates": list(measured.trials.candidates),
        "pruned_by_model": measured.plan.pruned,
        "model_pick": choice.strategy,
        "model_reason": choice.reason,
        "estimates_s": choice.estimates,
        "step_s_median_after": statistics.median(times),
        "step_s_after": times,
        "report": acc.report["compression"],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    for name, kind in (("rank", int), ("world", int), ("local", int), ("port", int), ("width", int),
                       ("layers", int), ("batch", int), ("warmup", int), ("steps", int)):  # fmt: skip
        parser.add_argument(f"--{name}", type=kind, required=True)
    parser.add_argument("--master", required=True)
    parser.add_argument("--iface", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--only", default="")
    args = parser.parse_args()
    args.local_rank = args.rank % args.local
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{args.master}:{args.port}",
        rank=args.rank,
        world_size=args.world,
        timeout=timedelta(seconds=300),
    )
    model = make_model(args.width, args.layers)
    grad_bytes = sum(p.numel() * 4 for p in model.parameters())
    rates = calibrate(args, grad_bytes)
    # The inter rate is only measured on local rank 0's peers; every rank needs it.
    shared = torch.tensor([rates["inter"], rates["intra"], rates["latency_s"]])
    dist.broadcast(shared, src=0)
    rates = {"inter": float(shared[0]), "intra": float(shared[1]), "latency_s": float(shared[2])}
    chosen = [s for s in STRATEGIES if not args.only or s in args.only.split(",")]
    results = {name: run_strategy(args, *STRATEGIES[name]) for name in chosen}
    pick = run_auto(args, rates)
    if args.rank == 0:
        doc = {"grad_bytes": grad_bytes, "calibration": rates, "strategies": results, "auto": pick}
        Path(args.out).write_text(json.dumps(doc))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    faulthandler.register(signal.SIGUSR1)  # `kill -USR1 <pid>` prints where a rank waits
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
