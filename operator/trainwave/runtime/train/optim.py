"""Layer-wise adaptive optimizers for large batches: LAMB and LARS.

torch.optim has neither (checked up to 2.15); Apex and DeepSpeed ship CUDA-only
fused versions. These run anywhere and use torch's multi-tensor (`_foreach_*`)
kernels when `foreach` is on, so on CUDA a step is a handful of kernel launches
per parameter group rather than a handful per parameter.

Both scale each parameter tensor's step by a trust ratio ||w|| / ||update||, so
every layer moves by a similar fraction of its weight whatever its gradient
scale. Set `trust_ratio: False` on a parameter group (biases, norms) to take the
plain step there, the usual practice.

LAMB (You et al., 2019, "Large Batch Optimization for Deep Learning"):
    m = b1 m + (1-b1) g;   v = b2 v + (1-b2) g^2
    u = m_hat / (sqrt(v_hat) + eps) + wd w          (m_hat, v_hat bias-corrected)
    w = w - lr * (||w|| / ||u||) * u                (ratio 1 if either norm is 0)
LARS (You et al., 2017, "Large Batch Training of Convolutional Networks"):
    local = eta ||w|| / (||g|| + wd ||w|| + eps)     (1 if either norm is 0)
    buf = mu buf + lr * local * (g + wd w);   w = w - buf
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor
from torch.optim import Optimizer

# Devices with multi-tensor kernels; elsewhere `_foreach_*` loops in Python, so
# the per-tensor path is as fast and simpler to read.
_FOREACH_DEVICES = frozenset({"cuda", "xpu"})


def _default_foreach(params: list[Tensor]) -> bool:
    return bool(params) and all(p.device.type in _FOREACH_DEVICES for p in params)


def _trust(weight_norm: Tensor, update_norm: Tensor) -> Tensor:
    ok = (weight_norm > 0) & (update_norm > 0)
    return torch.where(ok, weight_norm / update_norm.clamp_min(1e-30), torch.ones_like(weight_norm))


class _Adaptive(Optimizer):
    """Shared bookkeeping: params with grads per group, the foreach choice, closures."""

    def __init__(self, params: Iterable[Any], defaults: dict[str, Any]) -> None:
        if defaults["lr"] < 0:
            raise ValueError(f"lr must be >= 0, got {defaults['lr']}")
        if defaults["weight_decay"] < 0:
            raise ValueError(f"weight_decay must be >= 0, got {defaults['weight_decay']}")
        super().__init__(params, defaults)

    @staticmethod
    def _with_grads(group: dict[str, Any]) -> list[Tensor]:
        out: list[Tensor] = []
        for p in group["params"]:
            if p.grad is None:
                continue
            if p.grad.is_sparse:
                raise RuntimeError(f"{type(p).__name__} with a sparse gradient: not supported")
            out.append(p)
        return out

    def _use_foreach(self, group: dict[str, Any], params: list[Tensor]) -> bool:
        choice = group["foreach"]
        return _default_foreach(params) if choice is None else bool(choice)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = self._with_grads(group)
            if params:
                self._update(group, params, self._use_foreach(group, params))
        return loss

    def _update(self, group: dict[str, Any], params: list[Tensor], foreach: bool) -> None:
        raise NotImplementedError


class LAMB(_Adaptive):
    """LAMB; `trust_ratio=False` in a group gives AdamW's decoupled step there."""

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.01,
        *,
        bias_correction: bool = True,
        trust_ratio: bool = True,
        foreach: bool | None = None,
    ) -> None:
        for i, b in enumerate(betas):
            if not 0.0 <= b < 1.0:
                raise ValueError(f"betas[{i}] must be in [0, 1), got {b}")
        if eps <= 0:
            raise ValueError(f"eps must be > 0, got {eps}")
        defaults = {
            "lr": lr,
            "betas": betas,
            "eps": eps,
            "weight_decay": weight_decay,
            "bias_correction": bias_correction,
            "trust_ratio": trust_ratio,
            "foreach": foreach,
        }
        super().__init__(params, defaults)

    def _update(self, group: dict[str, Any], params: list[Tensor], foreach: bool) -> None:
        b1, b2 = group["betas"]
        grads = [p.grad for p in params]
        exp_avgs, exp_sqs, step = [], [], 0
        for p in params:
            st = self.state[p]
            if not st:
                st["step"] = 0
                st["exp_avg"] = torch.zeros_like(p)
                st["exp_avg_sq"] = torch.zeros_like(p)
            st["step"] += 1
            step = st["step"]  # the same for every param of a group that steps together
            exp_avgs.append(st["exp_avg"])
            exp_sqs.append(st["exp_avg_sq"])
        c1 = 1 - b1**step if group["bias_correction"] else 1.0
        c2 = 1 - b2**step if group["bias_correction"] else 1.0
        if foreach:
            torch._foreach_lerp_(exp_avgs, grads, 1 - b1)  # type: ignore[arg-type]
            torch._foreach_mul_(exp_sqs, b2)
            torch._foreach_addcmul_(exp_sqs, grads, grads, 1 - b2)  # type: ignore[arg-type]
            denom = torch._foreach_sqrt(exp_sqs)
            torch._foreach_div_(denom, c2**0.5)
            torch._foreach_add_(denom, group["eps"])
            updates = torch._foreach_div(exp_avgs, denom)
            torch._foreach_div_(updates, c1)
            if group["weight_decay"]:
                torch._foreach_add_(updates, params, alpha=group["weight_decay"])
            ratios = self._ratios(group, params, list(updates))
            torch._foreach_mul_(updates, ratios)
            torch._foreach_add_(params, updates, alpha=-group["lr"])
            return
        for p, g, m, v in zip(params, grads, exp_avgs, exp_sqs, strict=True):
            assert g is not None
            m.lerp_(g, 1 - b1)
            v.mul_(b2).addcmul_(g, g, value=1 - b2)
            update = (m / c1) / ((v / c2).sqrt() + group["eps"])
            if group["weight_decay"]:
                update.add_(p, alpha=group["weight_decay"])
            ratio = _trust(p.norm(), update.norm()) if group["trust_ratio"] else 1.0
            p.add_(update * ratio, alpha=-group["lr"])

    @staticmethod
    def _ratios(group: dict[str, Any], params: list[Tensor], updates: list[Tensor]) -> list[Tensor]:
        if not group["trust_ratio"]:
            return [torch.ones((), device=p.device) for p in params]
        w_norms = torch._foreach_norm(params)
        u_norms = torch._foreach_norm(updates)
        return [_trust(w, u) for w, u in zip(w_norms, u_norms, strict=True)]


class LARS(_Adaptive):
    """LARS with heavy-ball momentum; `trust_ratio=False` in a group gives SGD there."""

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 0.1,
        momentum: float = 0.9,
        weight_decay: float = 1e-4,
        *,
        eta: float = 1e-3,
        eps: float = 1e-9,
        trust_ratio: bool = True,
        foreach: bool | None = None,
    ) -> None:
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {momentum}")
        if eta <= 0:
            raise ValueError(f"eta (trust coefficient) must be > 0, got {eta}")
        defaults = {
            "lr": lr,
            "momentum": momentum,
            "weight_decay": weight_decay,
            "eta": eta,
            "eps": eps,
            "trust_ratio": trust_ratio,
            "foreach": foreach,
        }
        super().__init__(params, defaults)

    def _local_lr(self, group: dict[str, Any], w_norm: Tensor, g_norm: Tensor) -> Tensor:
        if not group["trust_ratio"]:
            return torch.ones_like(w_norm)
        denom = g_norm + group["weight_decay"] * w_norm + group["eps"]
        return _trust(group["eta"] * w_norm, denom)

    def _update(self, group: dict[str, Any], params: list[Tensor], foreach: bool) -> None:
        grads = [p.grad for p in params]
        bufs = []
        for p in params:
            st = self.state[p]
            if "momentum_buffer" not in st:
                st["momentum_buffer"] = torch.zeros_like(p)
            bufs.append(st["momentum_buffer"])
        wd, lr, mu = group["weight_decay"], group["lr"], group["momentum"]
        if foreach:
            w_norms = torch._foreach_norm(params)
            g_norms = torch._foreach_norm(grads)  # type: ignore[arg-type]
            scaled = torch._foreach_add(grads, params, alpha=wd)  # type: ignore[arg-type]
            locals_ = [
                self._local_lr(group, w, g) * lr for w, g in zip(w_norms, g_norms, strict=True)
            ]
            torch._foreach_mul_(scaled, locals_)
            torch._foreach_mul_(bufs, mu)
            torch._foreach_add_(bufs, scaled)
            torch._foreach_sub_(params, bufs)
            return
        for p, g, buf in zip(params, grads, bufs, strict=True):
            assert g is not None
            local = self._local_lr(group, p.norm(), g.norm())
            buf.mul_(mu).add_((g + wd * p) * (local * lr))
            p.sub_(buf)
