"""The training process of the fault benchmark (bench_faults.py): DDP over gloo, checkpoints.

Started by trainwave's launcher in a worker container on the real node, like any user
script. Compute dominates each step (an MLP wide enough that forward and backward take
tens of milliseconds on a CPU) so that a slowed rank shows in its own compute time, not
only in everyone's step time. Every rank appends one JSON line per completed step to
`<step log dir>/rank<R>.jsonl` (a hostPath the benchmark reads): the step, the wall
clock, the process's elastic generation (TORCHELASTIC_RESTART_COUNT) and the attempt.
The log survives the process, the pod and the gang, so the benchmark sees every step of
every generation and attempt, whichever way the job recovered.

Each process also appends one record to `<step log dir>/phases-rank<R>.jsonl` at its first
step: the wall clock at which it was started (from /proc), finished importing torch, built
its process group, loaded the checkpoint and completed its first step, so a recovery's
time can be split by phase (fault_phases.py).
"""

from __future__ import annotations

import time

PHASES: dict[str, float] = {"script": time.time()}  # before the heavy imports below

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from datetime import timedelta  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

from trainwave.runtime.checkpoint import Checkpointer  # noqa: E402
from trainwave.runtime.settings import load_settings  # noqa: E402
from trainwave.runtime.telemetry import Progress  # noqa: E402

PHASES["imported"] = time.time()

WIDTH = 1024
BATCH = 128


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--step-log", type=Path, required=True)
    parser.add_argument("--timeout-seconds", type=float, default=120,
                        help="the process group's collective timeout")  # fmt: skip
    args = parser.parse_args(argv)
    settings = load_settings(os.environ)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.timeout_seconds))
    PHASES["group"] = time.time()
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, 1)
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)  # imports torch._dynamo (torch 2.x)
    PHASES["model"] = time.time()
    checkpointer = Checkpointer.from_settings(settings)
    start = checkpointer.resume(model=model, optimizer=optimizer) if checkpointer else 0
    PHASES["resumed"] = time.time()
    ddp = DistributedDataParallel(model)
    PHASES["ddp"] = time.time()
    progress = Progress.from_settings(settings, total_steps=args.steps)
    watch = getattr(progress, "watch", None)
    if watch is not None:  # the runtime's compute timer, where the runtime has one
        watch(model)
    args.step_log.mkdir(parents=True, exist_ok=True)
    log = (args.step_log / f"rank{rank}.jsonl").open("a", buffering=1)
    generation = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    attempt = settings.identity.attempt
    generator = torch.Generator().manual_seed(rank)
    for step in range(start + 1, args.steps + 1):
        inputs = torch.randn(BATCH, WIDTH, generator=generator)
        loss = ddp(inputs).square().mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        record = {"step": step, "t": time.time(), "gen": generation, "attempt": attempt}
        log.write(json.dumps(record) + "\n")
        if step == start + 1:
            write_phases(args.step_log / f"phases-rank{rank}.jsonl", record)
        if progress is not None:
            progress.update(step, samples=BATCH * world, loss=float(loss))
        if checkpointer is not None and checkpointer.due(step):
            checkpointer.save(step, model=ddp, optimizer=optimizer)
    if progress is not None:
        progress.update(args.steps, force=True)
    dist.destroy_process_group()
    return 0


def process_started_at(pid: int | str = "self", proc: Path = Path("/proc")) -> float | None:
    """When the process was started, by the wall clock: its start in clock ticks since
    boot (proc(5)) against the uptime now (btime has whole seconds only); None off Linux."""
    try:
        now = time.time()
        uptime = float((proc / "uptime").read_text().split()[0])
        fields = (proc / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
        return now - (uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


def write_phases(path: Path, first_step: dict[str, object]) -> None:
    record = {
        "gen": first_step["gen"],
        "attempt": first_step["attempt"],
        "step": first_step["step"],
        "started": process_started_at(),
        **{name: round(at, 3) for name, at in PHASES.items()},
        "first_step": first_step["t"],
    }
    with path.open("a") as out:
        out.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
