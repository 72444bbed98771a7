"""The single-purpose steps `prepare()` applies, each returning its report entry.

Every function here decides one feature from its mode ("on", "off", "auto") and
what the machine offers, does it, and says what happened: "on: <detail>", "off"
(or "off: <why auto said no>"), or "skipped: <reason>" when the feature was asked
for and cannot apply. Nothing is dropped without a word.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import shutil
from collections.abc import Callable
from typing import Any

import torch
from torch.optim import Optimizer
from torch.utils import _foreach_utils


def choose_amp(
    mode: str, device: torch.device, dtype: str | None
) -> tuple[torch.dtype | None, bool, str]:
    """(autocast dtype or None, whether a GradScaler is needed, report)."""
    if mode == "off":
        return None, False, "off"
    cuda = device.type == "cuda"
    if dtype not in (None, "bf16", "fp16"):
        raise ValueError(f"amp dtype {dtype!r} is not accepted; use 'bf16' or 'fp16'")
    if not cuda:
        if mode == "auto":
            return (
                None,
                False,
                "off: auto enables AMP on CUDA only; amp=on gives bf16 autocast on CPU",
            )
        if dtype == "fp16":
            return None, False, "skipped: fp16 autocast needs CUDA (GradScaler); no CUDA, use bf16"
        return torch.bfloat16, False, "on: bf16 autocast (cpu)"
    if dtype is None:
        dtype = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    if dtype == "bf16":
        return torch.bfloat16, False, "on: bf16 autocast (cuda)"
    return torch.float16, True, "on: fp16 autocast (cuda) with GradScaler"


def _to_float32(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.float()
    if isinstance(value, tuple | list):
        return type(value)(_to_float32(v) for v in value)
    if isinstance(value, dict):
        return {k: _to_float32(v) for k, v in value.items()}
    return value


def autocast_forward(module: torch.nn.Module, device_type: str, dtype: torch.dtype) -> None:
    """Run `module`'s forward under autocast; outputs come back fp32 so losses stay exact."""
    forward: Callable[..., Any] = module.forward

    @functools.wraps(forward)
    def run(*args: Any, **kwargs: Any) -> Any:
        with torch.autocast(device_type, dtype=dtype):
            out = forward(*args, **kwargs)
        return _to_float32(out)

    # An instance attribute shadows the class's forward; DDP and compile call it.
    module.forward = run


def faster_optimizer(opt: Optimizer, device: torch.device, mode: str) -> tuple[Optimizer, str]:
    """Rebuild `opt` with fused (or multi-tensor foreach) kernels when its class offers them."""
    if mode == "off":
        return opt, "off"
    cls = type(opt)
    if any(opt.state.values()):
        return (
            opt,
            f"skipped: {cls.__name__} already has state; pass a fresh optimizer to prepare()",
        )
    params = inspect.signature(cls.__init__).parameters
    fused_ok = device.type in _foreach_utils._get_fused_kernels_supported_devices()
    foreach_ok = device.type in _foreach_utils._get_foreach_kernels_supported_devices()
    if "fused" in params and fused_ok:
        kind, override = "fused", {"fused": True, "foreach": False}
    elif "foreach" in params and foreach_ok:
        kind, override = "foreach", {"foreach": True}
    else:
        return opt, (
            f"skipped: {cls.__name__} has no fused or foreach kernels for {device.type}: "
            f"fused={'fused' in params} (device: {fused_ok}), "
            f"foreach={'foreach' in params} (device: {foreach_ok})"
        )
    groups = [
        {**g, **{k: v for k, v in override.items() if k in g or k == kind}}
        for g in opt.param_groups
    ]
    defaults = {k: v for k, v in opt.defaults.items() if k in params}
    defaults.update({k: v for k, v in override.items() if k in params})
    try:
        new = cls(groups, **defaults)
    except (RuntimeError, ValueError, TypeError) as exc:
        return opt, f"skipped: {cls.__name__} refused {kind}=True: {exc}"
    return new, f"on: {cls.__name__}({kind}=True)"


def compile_model(
    model: Any, compile_mode: str, graphs_mode: str, device: torch.device
) -> tuple[Any, dict[str, str]]:
    """torch.compile as the two opt-in features ask; returns the model and both reports."""
    cuda = device.type == "cuda"
    report = {}
    if graphs_mode == "on" and not cuda:
        report["cuda_graphs"] = "skipped: no CUDA"
    elif graphs_mode == "on":
        report["cuda_graphs"] = "on: torch.compile(mode='reduce-overhead')"
    else:
        report["cuda_graphs"] = "off" if graphs_mode == "off" else "off: opt-in (cuda_graphs=on)"
    with_graphs = graphs_mode == "on" and cuda
    if compile_mode == "auto":
        report["compile"] = "off: opt-in (compile=on)"
    elif compile_mode == "off":
        report["compile"] = "off"
    if compile_mode != "on" and not with_graphs:
        return model, report
    missing = compile_backend_missing(device)
    if missing:
        for name, mode in (("compile", compile_mode), ("cuda_graphs", graphs_mode)):
            if report.get(name, "").startswith("on") or mode == "on":
                report[name] = f"skipped: {missing}"
        return model, report
    mode = "reduce-overhead" if with_graphs else "default"
    if compile_mode == "on":
        report["compile"] = f"on: torch.compile(mode={mode!r})"
    return torch.compile(model, mode=mode), report


def compile_backend_missing(device: torch.device) -> str | None:
    """Why torch.compile cannot work here, or None when it can."""
    if device.type == "cuda":
        if importlib.util.find_spec("triton") is None:
            return "triton is not installed (Inductor needs it on CUDA)"
        return None
    if not (shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")):
        return "no C compiler on PATH (Inductor builds CPU kernels with one)"
    return None
