"""`auto` by measurement on 4 gloo ranks (2 emulated nodes x 2): trial steps are real steps.

Every synchronized step must be reduced by exactly one strategy, once, with
that strategy's semantics: the exact ones give the exact average, fp16 the
average to fp16 rounding, PowerSGD exact biases and the same low-rank weights
on every rank. After the trials every rank runs the same pick, and the pick is
what measured fastest.
"""

from __future__ import annotations

import pytest
import torch
from dist_harness import run_world
from train_factories import max_abs_diff, reference_params

WORLD, LOCAL = 4, 2
EXACT = 2e-6


def _accelerator(modes: dict, **options):
    from trainwave.runtime.accelerate import Accelerator
    from trainwave.runtime.comm.hooks import PowerSGDOptions
    from trainwave.runtime.comm.trials import TrialOptions

    return Accelerator(
        modes,
        local_world_size=LOCAL,
        powersgd=PowerSGDOptions(rank=1, start_iter=2),
        trials=TrialOptions(warmup_steps=1, timed_steps=1),
        **options,
    )


def _exact_trials(rank: int, world: int, steps: int) -> dict:
    """compression off, hierarchical auto: flat and hierarchical trials, then the pick."""
    from train_factories import GLOBAL_BATCH, LR, loss_fn, make_batch, make_model

    acc = _accelerator({"compression": "off", "hierarchical_allreduce": "auto"})
    model = make_model()
    model, opt, _ = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=LR))
    per = GLOBAL_BATCH // world
    for step in range(steps):
        x, y = make_batch(step)
        acc.backward(
            loss_fn(model(x[rank * per : (rank + 1) * per]), y[rank * per : (rank + 1) * per])
        )
        opt.step()
        opt.zero_grad()
    auto = acc.auto_comm
    acc.close()
    return {
        "params": [p.detach().clone() for p in acc.ddp.module.parameters()],
        "history": list(auto.state.history),
        "schedule": [auto.trials.strategy_at(s) for s in range(steps)],
        "chosen": auto.trials.chosen,
        "report": dict(acc.report),
    }


def _wide_model() -> torch.nn.Module:
    # Over 1 MiB of gradients, so DDP makes more than one bucket.
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(16, 256), torch.nn.Tanh(), torch.nn.Linear(256, 1280), torch.nn.Tanh(),
        torch.nn.Linear(1280, 4),
    )  # fmt: skip


def _every_strategy(rank: int, world: int, steps: int) -> dict:
    """All five candidates; each step's reduced gradients against the exact average."""
    import copy

    import torch.distributed as dist

    acc = _accelerator({"compression": "auto", "hierarchical_allreduce": "auto"})
    model = _wide_model()
    model, opt, _ = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.01))
    gen = torch.Generator().manual_seed(rank)
    per_step = []
    for _ in range(steps):
        x, y = torch.randn(4, 16, generator=gen), torch.randn(4, 4, generator=gen)
        # The exact average: every rank's local gradient from a plain copy, gathered.
        plain = copy.deepcopy(acc.ddp.module)
        torch.nn.functional.mse_loss(plain(x), y).backward()
        exact = []
        for p in plain.parameters():
            everyone = [torch.empty_like(p.grad) for _ in range(world)]
            dist.all_gather(everyone, p.grad)
            exact.append(torch.stack(everyone).mean(0))
        running = acc.auto_comm.state.active
        acc.backward(torch.nn.functional.mse_loss(model(x), y))
        reduced = [p.grad.detach().clone() for p in model.parameters()]
        per_step.append({"strategy": running, "reduced": reduced, "exact": exact})
        opt.step()
        opt.zero_grad()
    auto = acc.auto_comm
    acc.close()
    return {
        "steps": per_step,
        "history": list(auto.state.history),
        "schedule": [auto.trials.strategy_at(s) for s in range(steps)],
        "end": auto.trials.end,
        "chosen": auto.trials.chosen,
    }


def _slowed(rank: int, world: int, slow: str, steps: int) -> str:
    """Sleep in every step that runs `slow`: auto must measure that and pick the other."""
    import time

    from train_factories import LR, loss_fn, make_batch, make_model

    acc = _accelerator({"compression": "off", "hierarchical_allreduce": "auto"})
    model = make_model()
    model, opt, _ = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=LR))
    for step in range(steps):
        if acc.auto_comm.state.active == slow:
            time.sleep(0.2)
        x, y = make_batch(step)
        acc.backward(loss_fn(model(x), y))
        opt.step()
        opt.zero_grad()
    acc.close()
    return acc.auto_comm.trials.chosen


EXACT_STEPS, EVERY_STEPS, SLOW_STEPS = 6, 12, 5


def _all(rank: int, world: int) -> dict:
    # One world for every case: starting 4 ranks costs more than all the training.
    return {
        "exact": _exact_trials(rank, world, EXACT_STEPS),
        "every": _every_strategy(rank, world, EVERY_STEPS),
        "slowed": {
            slow: _slowed(rank, world, slow, SLOW_STEPS) for slow in ("flat", "hierarchical")
        },
    }


@pytest.fixture(scope="module")
def results() -> list[dict]:
    return run_world(_all, WORLD, timeout=100)


@pytest.mark.timeout(120)
def test_exact_trials_train_exactly_like_one_process(results):
    reference = reference_params(EXACT_STEPS)
    for rank, got in enumerate(r["exact"] for r in results):
        diff = max_abs_diff(got["params"], reference)
        assert diff <= EXACT, f"rank {rank}: |params - reference| = {diff:.3g}"
        assert [s for s, _ in got["history"]] == got["schedule"][:4]
        assert got["schedule"][:4] == ["flat", "hierarchical", "flat", "hierarchical"]
    assert len({r["exact"]["chosen"] for r in results}) == 1, "ranks disagree on the pick"
    report = results[0]["exact"]["report"]["hierarchical_allreduce"]
    assert "auto: chose " in report
    assert "measured ms/step: flat " in report
    assert "hierarchical " in report
    assert results[0]["exact"]["report"]["compression"] == "off"


@pytest.mark.timeout(120)
def test_every_trial_step_is_reduced_once_by_one_strategy(results):
    got = results[0]["every"]
    assert got["schedule"][: got["end"]] == [
        "flat", "hierarchical", "fp16", "hierarchical+fp16",
        "flat", "hierarchical", "fp16", "hierarchical+fp16",
        "powersgd", "powersgd",
    ]  # fmt: skip
    history = got["history"]
    assert [s for s, _ in history] == got["schedule"][: got["end"]]
    buckets = [n for _, n in history]
    # DDP rebuilds its buckets after the first step; from then on every step has as many.
    assert buckets[0] >= 1
    assert len(set(buckets[1:])) == 1, f"bucket calls per step: {buckets}"
    assert buckets[1] >= 2, "the model must span several buckets for this test to mean much"
    for step in got["steps"]:
        assert step["strategy"] in got["schedule"]


def _bound(strategy: str) -> float:
    return {"flat": EXACT, "hierarchical": EXACT, "fp16": 2e-3, "hierarchical+fp16": 2e-3}[strategy]


@pytest.mark.timeout(120)
def test_each_step_has_its_strategys_semantics(results):
    steps = EVERY_STEPS
    for index in range(steps):
        per_rank = [r["every"]["steps"][index] for r in results]
        strategy = per_rank[0]["strategy"]
        assert all(p["strategy"] == strategy for p in per_rank), f"step {index}: ranks split"
        for p in per_rank[1:]:  # whatever the strategy, every rank applies the same gradient
            assert max_abs_diff(p["reduced"], per_rank[0]["reduced"]) == 0.0
        reduced, exact = per_rank[0]["reduced"], per_rank[0]["exact"]
        if strategy == "powersgd":
            biases = [i for i, g in enumerate(exact) if g.dim() == 1]
            assert max_abs_diff([reduced[i] for i in biases], [exact[i] for i in biases]) <= EXACT
            # The big matrix goes as a rank-1 product: not the exact average.
            assert torch.linalg.matrix_rank(reduced[2]) <= 2, f"step {index}"
            assert max_abs_diff([reduced[2]], [exact[2]]) > 1e-4, f"step {index}: not compressed"
        else:
            scale = max(float(g.abs().max()) for g in exact)
            diff = max_abs_diff(reduced, exact)
            assert diff <= _bound(strategy) * max(1.0, scale), (
                f"step {index} {strategy}: {diff:.3g}"
            )


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("slow", "expected"), [("flat", "hierarchical"), ("hierarchical", "flat")])
def test_auto_picks_what_measured_fastest(results, slow, expected):
    assert [r["slowed"][slow] for r in results] == [expected] * WORLD
