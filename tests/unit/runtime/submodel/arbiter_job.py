"""One training job sharing a GPU through the arbiter, run in its own process.

The test forks these from a parent that has already imported torch, so three
jobs start in milliseconds instead of three torch imports on shared cores.
Each child has its own pid, arbiter connection and memory, and dies alone.
The socket comes from TRAINWAVE_ARBITER_SOCKET, as in a worker pod. A stalling
job stops forever right after its first grant, holding it, so the test can
SIGKILL it while it holds memory.
"""

import json
import os
import time
from pathlib import Path

import torch
from submodel_training import OPTIMIZERS, deterministic, loss_fn, make_case

from trainwave.runtime.submodel.arbiter import ArbiterClient
from trainwave.runtime.submodel.executor import SubmodelExecutor
from trainwave.runtime.submodel.partition import Partition

STEPS = 3


class Stalling(ArbiterClient):
    def __init__(self, holding: Path, job: str) -> None:
        super().__init__(job=job)
        self.holding = holding

    def acquire(self, nbytes: int) -> None:
        super().acquire(nbytes)
        # Written whole, then renamed: the test polls for the file and must
        # never read it half-written.
        partial = self.holding.with_suffix(".partial")
        partial.write_text(str(nbytes))
        partial.rename(self.holding)
        while True:
            time.sleep(60)


def run_job(part: Partition, result: Path, stall: bool) -> None:
    with deterministic():
        model, batches = make_case("mlp", steps=STEPS)
        client = (
            Stalling(result.with_suffix(".holding"), job=result.stem)
            if stall
            else ArbiterClient(job=result.stem)
        )
        executor = SubmodelExecutor(
            model, part, OPTIMIZERS["adamw"], loss_fn, part.largest.peak, turns=client
        )
        torch.manual_seed(1)
        losses = [executor.step(x, y).item() for x, y in batches]
    result.write_text(json.dumps({"losses": losses, "pid": os.getpid()}))
