"""LAMB and LARS against the papers' formulas, written out one tensor at a time in float64."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch

from trainwave.runtime.train.optim import LAMB, LARS

STEPS = 5


def make_params(seed: int = 0) -> list[torch.Tensor]:
    """A matrix, a vector and an all-zero tensor (whose trust ratio must fall back to 1)."""
    gen = torch.Generator().manual_seed(seed)
    return [
        torch.randn(6, 4, generator=gen, dtype=torch.float64),
        torch.randn(4, generator=gen, dtype=torch.float64),
        torch.zeros(3, dtype=torch.float64),
    ]


def make_grads(params: list[torch.Tensor], step: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 + step)
    return [torch.randn(p.shape, generator=gen, dtype=torch.float64) * 0.1 for p in params]


def ratio(num: float, den: float) -> float:
    return num / den if num > 0 and den > 0 else 1.0


def reference_lamb(params, *, lr, betas, eps, weight_decay, bias_correction, trust_ratio):
    b1, b2 = betas
    w = [p.clone() for p in params]
    m = [torch.zeros_like(p) for p in params]
    v = [torch.zeros_like(p) for p in params]
    for t in range(1, STEPS + 1):
        for i, g in enumerate(make_grads(params, t)):
            m[i] = b1 * m[i] + (1 - b1) * g
            v[i] = b2 * v[i] + (1 - b2) * g * g
            m_hat = m[i] / (1 - b1**t) if bias_correction else m[i]
            v_hat = v[i] / (1 - b2**t) if bias_correction else v[i]
            u = m_hat / (torch.sqrt(v_hat) + eps) + weight_decay * w[i]
            r = ratio(float(w[i].norm()), float(u.norm())) if trust_ratio else 1.0
            w[i] = w[i] - lr * r * u
    return w


def reference_lars(params, *, lr, momentum, weight_decay, eta, eps, trust_ratio):
    w = [p.clone() for p in params]
    buf = [torch.zeros_like(p) for p in params]
    for t in range(1, STEPS + 1):
        for i, g in enumerate(make_grads(params, t)):
            wn, gn = float(w[i].norm()), float(g.norm())
            local = ratio(eta * wn, gn + weight_decay * wn + eps) if trust_ratio else 1.0
            buf[i] = momentum * buf[i] + lr * local * (g + weight_decay * w[i])
            w[i] = w[i] - buf[i]
    return w


def run(make_opt: Callable[[list[torch.Tensor]], torch.optim.Optimizer]) -> list[torch.Tensor]:
    params = [torch.nn.Parameter(p) for p in make_params()]
    opt = make_opt(params)
    for t in range(1, STEPS + 1):
        for p, g in zip(params, make_grads(params, t), strict=True):
            p.grad = g
        opt.step()
    return [p.detach() for p in params]


LAMB_CASES = [
    pytest.param({}, id="defaults"),
    pytest.param({"weight_decay": 0.0}, id="no-weight-decay"),
    pytest.param({"bias_correction": False}, id="no-bias-correction"),
    pytest.param({"trust_ratio": False}, id="adamw-step"),
    pytest.param({"lr": 0.05, "betas": (0.8, 0.99), "eps": 1e-8}, id="other-hyperparameters"),
]


@pytest.mark.parametrize("foreach", [False, True], ids=["per-tensor", "foreach"])
@pytest.mark.parametrize("options", LAMB_CASES)
def test_lamb_matches_reference(options, foreach):
    hp = {"lr": 1e-2, "betas": (0.9, 0.999), "eps": 1e-6, "weight_decay": 0.01}
    hp |= {"bias_correction": True, "trust_ratio": True} | options
    got = run(lambda ps: LAMB(ps, foreach=foreach, **hp))
    want = reference_lamb(make_params(), **hp)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)
    assert not torch.equal(got[0], make_params()[0]), "the optimizer did not move the weights"


LARS_CASES = [
    pytest.param({}, id="defaults"),
    pytest.param({"weight_decay": 0.0}, id="no-weight-decay"),
    pytest.param({"momentum": 0.0}, id="no-momentum"),
    pytest.param({"trust_ratio": False}, id="sgd-step"),
    pytest.param({"eta": 0.02, "lr": 1.0}, id="large-trust-coefficient"),
]


@pytest.mark.parametrize("foreach", [False, True], ids=["per-tensor", "foreach"])
@pytest.mark.parametrize("options", LARS_CASES)
def test_lars_matches_reference(options, foreach):
    hp = {"lr": 0.1, "momentum": 0.9, "weight_decay": 1e-4, "eta": 1e-3, "eps": 1e-9}
    hp |= {"trust_ratio": True} | options
    got = run(lambda ps: LARS(ps, foreach=foreach, **hp))
    want = reference_lars(make_params(), **hp)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)
    assert not torch.equal(got[0], make_params()[0]), "the optimizer did not move the weights"


def test_trust_ratio_is_per_group():
    """Biases in a trust_ratio=False group take the plain step; weights keep the ratio."""
    weight, bias = (torch.nn.Parameter(p) for p in make_params()[:2])
    opt = LAMB([{"params": [weight]}, {"params": [bias], "trust_ratio": False}], lr=1e-2)
    assert [g["trust_ratio"] for g in opt.param_groups] == [True, False]


def test_skips_params_without_grad():
    p, q = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(3))
    opt = LARS([p, q], lr=0.1)
    p.grad = torch.ones(3)
    opt.step()
    assert torch.equal(q.detach(), torch.ones(3))
    assert not torch.equal(p.detach(), torch.ones(3))


@pytest.mark.parametrize(
    ("make", "message"),
    [
        pytest.param(
            lambda ps: LAMB(ps, lr=-1.0), "lr must be >= 0, got -1.0", id="lamb-negative-lr"
        ),
        pytest.param(
            lambda ps: LAMB(ps, betas=(1.0, 0.9)),
            r"betas\[0\] must be in \[0, 1\), got 1.0",
            id="lamb-beta",
        ),
        pytest.param(lambda ps: LAMB(ps, eps=0.0), "eps must be > 0, got 0.0", id="lamb-eps"),
        pytest.param(
            lambda ps: LARS(ps, momentum=1.5),
            r"momentum must be in \[0, 1\), got 1.5",
            id="lars-momentum",
        ),
        pytest.param(
            lambda ps: LARS(ps, eta=0.0),
            r"eta \(trust coefficient\) must be > 0, got 0.0",
            id="lars-eta",
        ),
        pytest.param(
            lambda ps: LARS(ps, weight_decay=-0.1),
            "weight_decay must be >= 0, got -0.1",
            id="lars-weight-decay",
        ),
    ],
)
def test_rejects_bad_hyperparameters(make, message):
    with pytest.raises(ValueError, match=message):
        make([torch.nn.Parameter(torch.ones(2))])


def test_lamb_step_size_is_relative_to_weight_norm():
    """What LAMB is for: with the ratio, a layer moves by lr * ||w|| whatever its gradient scale."""
    for scale in (1e-4, 1.0, 1e4):
        w = torch.nn.Parameter(torch.full((10,), 2.0))
        opt = LAMB([w], lr=0.01, weight_decay=0.0)
        w.grad = torch.linspace(1, 2, 10) * scale
        before = w.detach().clone()
        opt.step()
        moved = float((w.detach() - before).norm())
        assert math.isclose(moved, 0.01 * float(before.norm()), rel_tol=1e-5), scale
