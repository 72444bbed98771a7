"""DDP through `prepare()` on 4 gloo ranks (2 emulated nodes x 2) equals one process on the whole batch.

Every variant trains the same model on the same global batch: plain DDP and
hierarchical allreduce must match the single-process reference to float
rounding, with or without gradient accumulation; the lossy hooks (fp16, bf16,
PowerSGD, bf16 autocast) must stay within a stated bound of it.
"""

from __future__ import annotations

import pytest
import torch
from dist_harness import run_world
from train_factories import GLOBAL_BATCH, max_abs_diff, reference_params

WORLD, LOCAL, STEPS = 4, 2, 3
EXACT = 2e-6
# id: (feature modes, accumulation steps, bound on |param - reference|)
VARIANTS = {
    "ddp": ({"compression": "off", "hierarchical_allreduce": "off"}, 1, EXACT),
    "ddp-accumulate-2": ({"compression": "off", "hierarchical_allreduce": "off"}, 2, EXACT),
    "hierarchical": ({"hierarchical_allreduce": "on"}, 1, EXACT),
    "hierarchical-accumulate-2": ({"hierarchical_allreduce": "on"}, 2, EXACT),
    "fp16": ({"compression": "fp16", "hierarchical_allreduce": "off"}, 1, 1e-3),
    "bf16": ({"compression": "bf16", "hierarchical_allreduce": "off"}, 1, 1e-2),
    "hierarchical+fp16": ({"compression": "fp16", "hierarchical_allreduce": "on"}, 1, 1e-3),
    # Trials without rates: every candidate takes turns (step 2 runs fp16).
    "auto-without-link-rates": (
        {"compression": "auto", "hierarchical_allreduce": "auto"},
        1,
        1e-3,
    ),
    "amp-bf16-autocast": ({"amp": "on", "hierarchical_allreduce": "off"}, 1, 2e-2),
}


def _train(rank: int, world: int, variants: dict) -> dict:
    import torch.distributed as dist
    from train_factories import LR, loss_fn, make_batch, make_model

    from trainwave.runtime.accelerate import Accelerator

    out = {}
    per_rank = GLOBAL_BATCH // world
    for vid, (modes, k, _) in variants.items():
        acc = Accelerator(modes, gradient_accumulation_steps=k, local_world_size=LOCAL)
        model = make_model()
        model, opt, _ = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=LR))
        unsynced_differ = synced_equal = None
        for step in range(STEPS):
            x, y = make_batch(step)
            x, y = (
                x[rank * per_rank : (rank + 1) * per_rank],
                y[rank * per_rank : (rank + 1) * per_rank],
            )
            for xm, ym in zip(x.chunk(k), y.chunk(k), strict=True):
                with acc.accumulate():
                    acc.backward(loss_fn(model(xm), ym))
                    grad = next(model.parameters()).grad.detach().clone()
                    everyone = [torch.empty_like(grad) for _ in range(world)]
                    dist.all_gather(everyone, grad)
                    same = all(torch.allclose(everyone[0], g) for g in everyone)
                    if acc.sync_gradients:
                        synced_equal = same if synced_equal is None else synced_equal and same
                    else:
                        unsynced_differ = (
                            not same if unsynced_differ is None else unsynced_differ and not same
                        )
                    opt.step()
                    opt.zero_grad()
        params = [p.detach().clone() for p in acc.ddp.module.parameters()]
        out[vid] = {
            "params": params,
            "report": dict(acc.report),
            "synced_equal": synced_equal,
            "unsynced_differ": unsynced_differ,
        }
    return out


def _all(rank: int, world: int, variants: dict, powersgd_steps: int) -> dict:
    # One world for every case: starting 4 ranks costs more than all the training.
    return {
        "variants": _train(rank, world, variants),
        "powersgd": _powersgd(rank, world, powersgd_steps),
    }


POWERSGD_STEPS = 5


@pytest.fixture(scope="module")
def world_results() -> list[dict]:
    return run_world(_all, WORLD, VARIANTS, POWERSGD_STEPS, timeout=80)


@pytest.fixture(scope="module")
def results(world_results) -> list[dict]:
    return [r["variants"] for r in world_results]


@pytest.mark.timeout(90)
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_variant_matches_single_process(results, variant):
    _, k, bound = VARIANTS[variant]
    reference = reference_params(STEPS)
    moved = max_abs_diff(reference, reference_params(0))
    for rank, per_rank in enumerate(results):
        got = per_rank[variant]
        diff = max_abs_diff(got["params"], reference)
        assert diff <= bound, f"rank {rank}: |params - reference| = {diff:.3g} > {bound}"
        assert diff < moved / 10, "the bound is too loose to mean anything"
        assert got["synced_equal"], f"rank {rank}: gradients differ after the synchronizing step"
        if k > 1:
            assert got["unsynced_differ"], f"rank {rank}: gradients were exchanged inside no_sync"


@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    ("variant", "feature", "expected"),
    [
        pytest.param(
            "ddp", "ddp_buckets", "on: bucket_cap_mb=1 for 0.0 MiB of gradients", id="buckets"
        ),
        pytest.param("ddp", "hierarchical_allreduce", "off", id="hier-off"),
        pytest.param(
            "hierarchical", "hierarchical_allreduce", "on: 2 nodes x 2 local ranks", id="hier-on"
        ),
        pytest.param("hierarchical+fp16", "compression", "on: fp16", id="hier-fp16"),
        pytest.param("bf16", "compression", "on: bf16", id="bf16"),
        pytest.param("amp-bf16-autocast", "amp", "on: bf16 autocast (cpu)", id="amp"),
        pytest.param(
            "auto-without-link-rates",
            "hierarchical_allreduce",
            "auto: measuring flat, hierarchical, fp16, hierarchical+fp16, powersgd "
            "(1 warm-up + 3 timed steps each; step 3 of ",
            id="auto-measures-without-rates",
        ),
    ],
)
def test_report_says_what_was_done(results, variant, feature, expected):
    assert results[0][variant]["report"][feature].startswith(expected)


def _powersgd(rank: int, world: int, steps: int) -> dict:
    """Rank-1 gradients (every rank: one sample, the same input) are what rank-1 PowerSGD sends exactly."""
    from trainwave.runtime.accelerate import Accelerator
    from trainwave.runtime.comm.hooks import PowerSGDOptions

    acc = Accelerator(
        {"compression": "powersgd", "hierarchical_allreduce": "off"},
        powersgd=PowerSGDOptions(rank=1, start_iter=2),
    )
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8, bias=False)
    model, opt, _ = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    x = torch.linspace(-1, 1, 8).unsqueeze(0)
    for step in range(steps):
        target = torch.full((1, 8), float(rank + step))
        acc.backward(torch.nn.functional.mse_loss(model(x), target))
        opt.step()
        opt.zero_grad()
    state = acc.hook.state
    return {
        "weight": acc.ddp.module.weight.detach().clone(),
        "iter": state.iter,
        "report": acc.report["compression"],
    }


@pytest.mark.timeout(90)
def test_powersgd_sends_rank_one_gradients_exactly(world_results):
    steps = POWERSGD_STEPS
    results = [r["powersgd"] for r in world_results]
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8, bias=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.linspace(-1, 1, 8).unsqueeze(0)
    for step in range(steps):
        loss = (
            sum(
                torch.nn.functional.mse_loss(model(x), torch.full((1, 8), float(r + step)))
                for r in range(WORLD)
            )
            / WORLD
        )
        loss.backward()
        opt.step()
        opt.zero_grad()
    for got in results:
        assert got["iter"] >= 2 + 1, "PowerSGD never left its uncompressed warm-up"
        assert got["report"] == "on: powersgd rank 1 from step 2, one bucket at a time (gloo)"
        torch.testing.assert_close(got["weight"], model.weight.detach(), rtol=1e-5, atol=1e-6)
