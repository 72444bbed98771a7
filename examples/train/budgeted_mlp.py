"""A classifier trained within the shared-GPU memory budget trainwave gives the worker.

The three-line API with the loss handed to prepare(): on a shared GPU
(TRAINWAVE_GPU_MEMORY_BUDGET_BYTES set by the operator) prepare() caps the
allocator and, when the model's measured peak does not fit the budget, trains
it through the submodel allocator; train_step() is the same loop either way.

    python examples/train/budgeted_mlp.py --steps 20

One JSON line per event on stdout: `start` (prepare()'s report and the
budget), `step` (loss), `done` (the device-memory peaks measured while
training, bytes; on a machine without CUDA the device tier is simulated on the
CPU, so they are model-based).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
from torch import nn

from trainwave.runtime import accelerate
from trainwave.runtime.settings import load_settings

FEATURES, CLASSES = 32, 10


def build_model(width: int, depth: int) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Linear(FEATURES, width), nn.ReLU()]
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    layers.append(nn.Linear(width, CLASSES))
    return nn.Sequential(*layers)


def batch(step: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed task: the label is which of CLASSES fixed directions x is closest to."""
    directions = torch.randn(CLASSES, FEATURES, generator=torch.Generator().manual_seed(0))
    x = torch.randn(size, FEATURES, generator=torch.Generator().manual_seed(1000 + step))
    return x, (x @ directions.T).argmax(dim=1)


def log(event: str, **fields: object) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def main(argv: list[str]) -> int:
    settings = load_settings(os.environ)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=settings.total_steps or 20)
    parser.add_argument("--width", type=int, default=160)
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--step-seconds", type=float, default=0.0)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = build_model(args.width, args.depth)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    accelerate.prepare(
        model, optimizer, loss_fn=nn.functional.cross_entropy, sample=batch(0, args.batch)
    )
    held = accelerate.current().held
    log("start", report=accelerate.current().report, budget=held.budget,
        plain_peak=held.plain_peak, pid=os.getpid())  # fmt: skip
    for step in range(1, args.steps + 1):
        x, y = batch(step, args.batch)
        loss = accelerate.train_step(x, y)
        log("step", step=step, loss=float(loss))
        time.sleep(args.step_seconds)
    log("done", peaks=held.peaks())
    accelerate.current().close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
