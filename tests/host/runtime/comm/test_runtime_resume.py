"""A gang restart with the two checkpoint lines: the resumed run equals the one never stopped.

The model has dropout, so every rank's random stream matters: resuming rank 0's
stream on all ranks would give different masks and different weights.
"""

from __future__ import annotations

import pytest
import torch
from dist_harness import run_world

WORLD, EVERY, CRASH_AFTER, TOTAL = 4, 2, 5, 7


def make_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.Dropout(0.5), torch.nn.Tanh(), torch.nn.Linear(32, 4)
    )


def _gang(rank: int, world: int, directory: str) -> dict:
    from train_factories import GLOBAL_BATCH, loss_fn, make_batch

    from trainwave.runtime.accelerate import Accelerator
    from trainwave.runtime.settings import load_settings

    # Plain DDP, so the comparison is about checkpoints, not about auto's trials.
    environ = {
        "RANK": str(rank),
        "WORLD_SIZE": str(world),
        "TRAINWAVE_FEATURE_HIERARCHICAL_ALLREDUCE": "off",
    }
    checkpoints = {
        "TRAINWAVE_CHECKPOINT_DIR": directory,
        "TRAINWAVE_CHECKPOINT_EVERY_STEPS": str(EVERY),
    }
    per = GLOBAL_BATCH // world

    def attempt(env: dict, seed: int, stop: int) -> tuple[list[torch.Tensor], int]:
        acc = Accelerator.from_settings(load_settings(env))
        model = make_model(seed)
        torch.manual_seed(1000 + rank)  # each rank's own dropout stream
        model, opt, _ = acc.prepare(
            model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        )
        start = acc.resume()  # line one
        for step in range(start, stop):
            x, y = make_batch(step)
            acc.backward(
                loss_fn(model(x[rank * per : (rank + 1) * per]), y[rank * per : (rank + 1) * per])
            )
            opt.step()
            opt.zero_grad()
            acc.save_checkpoint()  # line two: counts optimizer steps itself
        acc.close()
        return [p.detach().clone() for p in acc.ddp.module.parameters()], start

    never_stopped, _ = attempt(environ, 0, TOTAL)
    attempt({**environ, **checkpoints}, 0, CRASH_AFTER)  # the gang dies after step 5
    torch.manual_seed(12345)  # a restarted process starts from an unrelated state
    resumed, start = attempt({**environ, **checkpoints}, 7, TOTAL)
    return {"never_stopped": never_stopped, "resumed": resumed, "start": start}


@pytest.mark.timeout(90)
def test_gang_restart_resumes_where_the_last_checkpoint_left(tmp_path):
    from train_factories import max_abs_diff

    results = run_world(_gang, WORLD, str(tmp_path), timeout=80)
    files = sorted(p.name for p in tmp_path.iterdir())
    # Saved at 2 and 4 before the crash, then 6 after the restart; keep=3.
    assert files == ["step-000000000002.pt", "step-000000000004.pt", "step-000000000006.pt"]
    for rank, got in enumerate(results):
        assert got["start"] == 4, f"rank {rank} resumed at {got['start']}"
        diff = max_abs_diff(got["resumed"], got["never_stopped"])
        assert diff <= 1e-6, f"rank {rank}: resumed run differs from the one never stopped: {diff}"
    moved = max_abs_diff(results[0]["never_stopped"], list(make_model(0).parameters()))
    assert moved > 1e-3, "training did not move the weights: the comparison means nothing"
