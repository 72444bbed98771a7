"""`prepare()` with no modes: the operator's environment configures it and it joins the group itself."""

from __future__ import annotations

import pytest
import torch
from dist_harness import run_world

WORLD = 4
FIXED = {
    "TRAINWAVE_FEATURE_COMPRESSION": "fp16",
    "TRAINWAVE_FEATURE_HIERARCHICAL_ALLREDUCE": "on",
    "TRAINWAVE_FEATURE_TF32": "auto",  # a zero-code feature: prepare() leaves it alone
    "LOCAL_WORLD_SIZE": "2",
    "TRAINWAVE_CHECKPOINT_DIR": "/checkpoints",
    "TRAINWAVE_CHECKPOINT_EVERY_STEPS": "50",
}
AUTO = {
    "TRAINWAVE_FEATURE_COMPRESSION": "auto",
    "TRAINWAVE_FEATURE_HIERARCHICAL_ALLREDUCE": "auto",
    "TRAINWAVE_INTER_NODE_GBPS": "0.1",
    "TRAINWAVE_INTRA_NODE_GBPS": "10",
}


def _prepare_from_env(rank: int, world: int) -> dict:
    import os

    import torch.distributed as dist
    from train_factories import LR, make_model

    from trainwave.runtime import accelerate

    out = {"initialized_before": dist.is_initialized()}
    model = make_model()
    accelerate.prepare(model, torch.optim.SGD(model.parameters(), lr=LR))
    acc = accelerate.current()
    out["fixed"] = {
        "backend": dist.get_backend(),
        "world": dist.get_world_size(),
        "rank": dist.get_rank(),
        "report": dict(acc.report),
    }
    acc.close()
    # A second prepare() in the same process: the group exists, the rates come from env.
    os.environ.update(AUTO)
    model = make_model()
    accelerate.prepare(model, torch.optim.SGD(model.parameters(), lr=LR))
    acc = accelerate.current()
    out["auto"] = {
        "report": dict(acc.report),
        "model_saw_rates": acc.comm_choice is not None,
        "candidates": list(acc.auto_comm.trials.candidates),
    }
    acc.close()
    return out


@pytest.fixture(scope="module")
def results() -> list[dict]:
    return run_world(_prepare_from_env, WORLD, init=False, env=FIXED, timeout=80)


@pytest.mark.timeout(90)
def test_prepare_joins_the_group_from_env(results):
    for rank, got in enumerate(results):
        assert got["initialized_before"] is False
        fixed = got["fixed"]
        assert (fixed["backend"], fixed["world"], fixed["rank"]) == ("gloo", WORLD, rank)
        assert fixed["report"]["process_group"].startswith("on: gloo over env:// (127.0.0.1:")
        assert fixed["report"]["process_group"].endswith(f"rank {rank} of {WORLD}")


@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    ("feature", "expected"),
    [
        pytest.param("compression", "on: fp16", id="compression-from-env"),
        pytest.param(
            "hierarchical_allreduce", "on: 2 nodes x 2 local ranks", id="local-world-size-from-env"
        ),
        pytest.param(
            "checkpoint",
            "on: every 50 steps into /checkpoints, keep 3",
            id="checkpoint-from-env",
        ),
    ],
)
def test_modes_come_from_env(results, feature, expected):
    assert results[0]["fixed"]["report"][feature].startswith(expected)


@pytest.mark.timeout(90)
def test_auto_gets_link_rates_from_env(results):
    for got in results:
        auto = got["auto"]
        assert auto["report"]["process_group"] == "on: the script's own group (gloo, 4 ranks)"
        assert auto["model_saw_rates"], "the cost model never saw TRAINWAVE_*_GBPS"
        # 0.1 Gbit/s across nodes: flat and hierarchical are kept (the exact baseline),
        # and the model's favourite, PowerSGD.
        assert auto["candidates"][:2] == ["flat", "hierarchical"]
        assert "powersgd" in auto["candidates"]
        assert auto["report"]["compression"].startswith("auto: measuring ")
    assert len({tuple(r["auto"]["candidates"]) for r in results}) == 1
