"""Distributed training on CPU or GPU: an MLP learns a synthetic regression task with DDP.

Start it the way trainwave starts workers: under torchrun, which reads the
PET_* variables the operator sets (with `spec.runtime`, the launcher runs
torchrun for you when processesPerWorker > 1):

    torchrun --nnodes 1 --nproc-per-node 2 examples/train/regression_ddp.py --steps 50

The backend is NCCL on GPUs and gloo otherwise. Checkpoints use trainwave's
runtime (`trainwave.runtime.checkpoint`): with TRAINWAVE_CHECKPOINT_DIR set
(spec.runtime.checkpoint), rank 0 saves every TRAINWAVE_CHECKPOINT_EVERY_STEPS
steps and every rank resumes from the newest good checkpoint, so a restarted
gang continues the step count instead of starting over. Progress (step, loss,
samples/s, and the time per step and per forward that name a slow rank) goes
to the runtime's report directory for the launcher's /status. With in-place
restarts (spec.runtime.inPlaceRestarts) a failed process restarts the gang
inside its pods: the script simply starts again and resumes.

Rank 0 prints one JSON line per event to stdout: `start` (world size, the
step it starts from), `step` (the loss averaged over all ranks), `done`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from trainwave.runtime.checkpoint import Checkpointer
from trainwave.runtime.settings import load_settings
from trainwave.runtime.telemetry import Progress

FEATURES = 16
EXAMPLES = 4096
BATCH = 64


def parse_args(argv: list[str], default_steps: int) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--steps",
        type=int,
        default=default_steps,
        help="total steps of the run (default: TRAINWAVE_TOTAL_STEPS or 100)",
    )
    parser.add_argument("--lr", type=float, default=0.03, help="Adam learning rate")
    parser.add_argument("--step-seconds", type=float, default=0.0,
                        help="sleep after each step, to make a short run observable")  # fmt: skip
    return parser.parse_args(argv)


def dataset(seed: int = 2026) -> tuple[torch.Tensor, torch.Tensor]:
    """y = a fixed nonlinear function of x plus a little noise; the same on every rank."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(EXAMPLES, FEATURES, generator=generator)
    w = torch.randn(FEATURES, 1, generator=generator)
    y = torch.tanh(x @ w) * 3 + 0.5 * x[:, :1] ** 2
    return x, y + 0.05 * torch.randn(EXAMPLES, 1, generator=generator)


def batch_indices(step: int, rank: int) -> torch.Tensor:
    # A function of (step, rank) only: a resumed run sees exactly the batches it
    # would have seen, with no sampler state to save.
    generator = torch.Generator().manual_seed(step * 1_000 + rank)
    return torch.randint(0, EXAMPLES, (BATCH,), generator=generator)


def log(rank: int, event: str, **fields: object) -> None:
    if rank == 0:
        print(json.dumps({"event": event, **fields}), flush=True)


def main(argv: list[str]) -> int:
    settings = load_settings(os.environ)
    args = parse_args(argv, settings.total_steps or 100)
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda else None
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, 1)).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    checkpointer = Checkpointer.from_settings(settings)
    start = checkpointer.resume(model=model, optimizer=optimizer) if checkpointer else 0
    ddp = DistributedDataParallel(model)
    progress = Progress.from_settings(settings, total_steps=args.steps)
    if progress is not None:
        progress.watch(model)  # the forward's time is the compute a slow rank is named by
    x, y = dataset()
    log(rank, "start", world_size=world, resumed_from=start, attempt=settings.identity.attempt,
        checkpoints=str(checkpointer.directory) if checkpointer else None)  # fmt: skip
    last_loss = None
    for step in range(start + 1, args.steps + 1):
        rows = batch_indices(step, rank)
        inputs, targets = x[rows].to(device), y[rows].to(device)
        loss = nn.functional.mse_loss(ddp(inputs), targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        mean /= world
        last_loss = mean.item()
        log(rank, "step", step=step, loss=round(last_loss, 6))
        if progress is not None:
            progress.update(step, samples=BATCH * world, loss=last_loss)
        if checkpointer is not None and checkpointer.due(step):
            checkpointer.save(step, model=ddp, optimizer=optimizer)
        if args.step_seconds:
            time.sleep(args.step_seconds)
    if progress is not None:
        progress.update(args.steps, loss=last_loss, force=True)
    log(rank, "done", steps=args.steps)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
