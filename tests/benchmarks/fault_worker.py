"""The training process of the fault benchmark (bench_faults.py): DDP over gloo, checkpoints.

Started by trainwave's launcher in a worker container on the real node, like any user
script. Compute dominates each step (an MLP wide enough that forward and backward take
tens of milliseconds on a CPU) so that a slowed rank shows in its own compute time, not
only in everyone's step time. Every rank appends one JSON line per completed step to
`<step log dir>/rank<R>.jsonl` (a hostPath the benchmark reads): the step, the wall
clock, the process's elastic generation (TORCHELASTIC_RESTART_COUNT) and the attempt.
The log survives the process, the pod and the gang, so the benchmark sees every step of
every generation and attempt, whichever way the job recovered.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from trainwave.runtime.checkpoint import Checkpointer
from trainwave.runtime.settings import load_settings
from trainwave.runtime.telemetry import Progress

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
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, 1)
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    checkpointer = Checkpointer.from_settings(settings)
    start = checkpointer.resume(model=model, optimizer=optimizer) if checkpointer else 0
    ddp = DistributedDataParallel(model)
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
        if progress is not None:
            progress.update(step, samples=BATCH * world, loss=float(loss))
        if checkpointer is not None and checkpointer.due(step):
            checkpointer.save(step, model=ddp, optimizer=optimizer)
    if progress is not None:
        progress.update(args.steps, force=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
