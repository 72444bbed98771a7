"""prepare/backward/accumulate in one process: accumulation, AMP, optimizer choice, the report."""

from __future__ import annotations

import pytest
import torch
from train_factories import LR, loss_fn, make_batch, make_model, max_abs_diff, reference_params

from trainwave.runtime import accelerate
from trainwave.runtime.accelerate import Accelerator
from trainwave.runtime.train.optim import LAMB

STEPS = 3


def train(acc: Accelerator, micro_batches: int, opt_factory=None) -> tuple[list[torch.Tensor], int]:
    """STEPS optimizer steps over the global batch split into `micro_batches`; returns params, steps taken."""
    model = make_model()
    opt = (opt_factory or (lambda ps: torch.optim.SGD(ps, lr=LR)))(model.parameters())
    model, opt, _ = acc.prepare(model, opt)
    taken = 0
    for step in range(STEPS):
        x, y = make_batch(step)
        for xm, ym in zip(x.chunk(micro_batches), y.chunk(micro_batches), strict=True):
            with acc.accumulate():
                acc.backward(loss_fn(model(xm), ym))
                before = [p.detach().clone() for p in model.parameters()]
                opt.step()
                opt.zero_grad()
                taken += max_abs_diff(before, list(model.parameters())) > 0
    return [p.detach().clone() for p in model.parameters()], taken


@pytest.mark.parametrize("k", [1, 2, 4, 8], ids=lambda k: f"k={k}")
def test_accumulating_k_micro_batches_equals_one_batch(k):
    params, taken = train(Accelerator(gradient_accumulation_steps=k), micro_batches=k)
    assert max_abs_diff(params, reference_params(STEPS)) < 2e-6
    assert taken == STEPS, "the optimizer must step once per window, not per micro-batch"


def test_without_accumulate_every_micro_batch_steps():
    acc = Accelerator(gradient_accumulation_steps=1)
    _, taken = train(acc, micro_batches=2)
    assert taken == 2 * STEPS


def test_bf16_autocast_on_cpu_runs_matmuls_in_bf16_and_returns_fp32():
    acc = Accelerator({"amp": "on"})
    model = make_model()
    seen = []
    model[0].register_forward_hook(lambda _m, _i, out: seen.append(out.dtype))
    model, _, _ = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=LR))
    out = model(make_batch(0)[0])
    assert seen == [torch.bfloat16]
    assert out.dtype == torch.float32
    params, _ = train(Accelerator({"amp": "on"}), micro_batches=1)
    assert max_abs_diff(params, reference_params(STEPS)) < 2e-2


@pytest.mark.parametrize(
    ("modes", "options", "feature", "expected"),
    [
        pytest.param({}, {}, "amp", "off: auto enables AMP on CUDA only", id="amp-auto-cpu"),
        pytest.param(
            {"amp": "on"},
            {"amp_dtype": "fp16"},
            "amp",
            "skipped: fp16 autocast needs CUDA",
            id="amp-fp16-cpu",
        ),
        pytest.param({"amp": "off"}, {}, "amp", "off", id="amp-off"),
        pytest.param({}, {}, "fused_optimizer", "on: SGD(fused=True)", id="sgd-fused-on-cpu"),
        pytest.param({"fused_optimizer": "off"}, {}, "fused_optimizer", "off", id="fused-off"),
        pytest.param({}, {}, "ddp_buckets", "skipped: single process", id="no-ddp"),
        pytest.param(
            {"compression": "fp16"},
            {},
            "compression",
            "skipped: single process",
            id="compression-single-process",
        ),
        pytest.param({"compression": "off"}, {}, "compression", "off", id="compression-off"),
        pytest.param(
            {"cuda_graphs": "on"}, {}, "cuda_graphs", "skipped: no CUDA", id="cuda-graphs-cpu"
        ),
        pytest.param({}, {}, "cuda_graphs", "off", id="cuda-graphs-default"),
        pytest.param(
            {"compile": "auto"}, {}, "compile", "off: opt-in (compile=on)", id="compile-auto"
        ),
        pytest.param(
            {"compile": "on"}, {}, "compile", "on: torch.compile(mode='default')", id="compile-on"
        ),
    ],
)
def test_report(modes, options, feature, expected):
    acc = Accelerator(modes, **options)
    model = make_model()
    acc.prepare(model, torch.optim.SGD(model.parameters(), lr=LR))
    assert acc.report[feature].startswith(expected), acc.report[feature]


def test_every_feature_prepare_touches_is_reported():
    acc = Accelerator()
    model = make_model()
    acc.prepare(model, torch.optim.SGD(model.parameters(), lr=LR))
    # compute_time: the forward hooks of the progress reports' compute_seconds.
    assert set(acc.report) == {*accelerate.DEFAULT_MODES, "compute_time"}
    assert all(
        v == "off" or v.startswith(("on", "off:", "skipped:")) for v in acc.report.values()
    ), acc.report


@pytest.mark.parametrize(
    ("make_opt", "expected"),
    [
        pytest.param(
            lambda ps: torch.optim.AdamW(ps, lr=1e-3), "on: AdamW(fused=True)", id="adamw"
        ),
        pytest.param(
            LAMB,
            "skipped: LAMB has no fused or foreach kernels for cpu",
            id="lamb-on-cpu",
        ),
    ],
)
def test_optimizer_choice(make_opt, expected):
    acc = Accelerator()
    model = make_model()
    _, opt, _ = acc.prepare(model, make_opt(model.parameters()))
    assert acc.report["fused_optimizer"].startswith(expected)
    if "fused=True" in expected:
        assert all(g["fused"] for g in opt.param_groups)


def test_optimizer_with_state_is_kept_and_said_so():
    model = make_model()
    opt = torch.optim.Adam(model.parameters())
    loss_fn(model(make_batch(0)[0]), make_batch(0)[1]).backward()
    opt.step()
    acc = Accelerator()
    _, prepared, _ = acc.prepare(model, opt)
    assert prepared.optimizer is opt
    assert (
        acc.report["fused_optimizer"]
        == "skipped: Adam already has state; pass a fresh optimizer to prepare()"
    )


@pytest.mark.parametrize(
    ("modes", "message"),
    [
        pytest.param({"amp": "yes"}, "feature amp='yes'; accepted: on, off, auto", id="bad-mode"),
        pytest.param(
            {"compression": "int8"},
            "feature compression='int8'; accepted: off, auto, fp16, bf16, powersgd",
            id="bad-compression",
        ),
        pytest.param(
            {"warp_drive": "on"},
            "unknown feature 'warp_drive'; accepted: tf32, amp",
            id="unknown-feature",
        ),
    ],
)
def test_bad_modes_are_refused_by_name(modes, message):
    with pytest.raises(ValueError, match=message):
        Accelerator(modes)


def test_accumulation_steps_must_be_positive():
    with pytest.raises(ValueError, match="gradient_accumulation_steps must be >= 1, got 0"):
        Accelerator(gradient_accumulation_steps=0)


def test_module_level_three_lines():
    accelerate._current.clear()
    with pytest.raises(RuntimeError, match="prepare"):
        accelerate.backward(torch.zeros(()))
    model = make_model()
    model, opt, loader = accelerate.prepare(
        model, torch.optim.SGD(model.parameters(), lr=LR), ["batch"], gradient_accumulation_steps=2
    )
    assert loader == ["batch"]
    for step in range(STEPS):
        x, y = make_batch(step)
        for xm, ym in zip(x.chunk(2), y.chunk(2), strict=True):
            with accelerate.accumulate():
                accelerate.backward(loss_fn(model(xm), ym))
                opt.step()
                opt.zero_grad()
    assert max_abs_diff(list(model.parameters()), reference_params(STEPS)) < 2e-6
