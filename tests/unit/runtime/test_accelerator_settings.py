"""The Accelerator configured from the worker's environment, and its two checkpoint lines (one process)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trainwave.runtime import accelerate
from trainwave.runtime.accelerate import Accelerator
from trainwave.runtime.settings import SettingsError, load_settings


def make_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def prepared(env: dict[str, str], seed: int = 0):
    acc = Accelerator.from_settings(load_settings(env))
    model = make_model(seed)
    model, opt, _ = acc.prepare(model, torch.optim.AdamW(model.parameters(), lr=0.01))
    return acc, model, opt


def train(acc, model, opt, steps: range) -> list[Path | None]:
    saved = []
    for step in steps:
        gen = torch.Generator().manual_seed(step)
        acc.backward(model(torch.randn(4, 8, generator=gen)).square().mean())
        opt.step()
        opt.zero_grad()
        saved.append(acc.save_checkpoint(step + 1))
    return saved


@pytest.mark.parametrize(
    ("env", "feature", "expected"),
    [
        pytest.param({}, "amp", "off: auto enables AMP on CUDA only", id="defaults"),
        pytest.param(
            {"TRAINWAVE_FEATURE_AMP": "on"}, "amp", "on: bf16 autocast (cpu)", id="amp-on"
        ),
        pytest.param(
            {"TRAINWAVE_FEATURE_FUSED_OPTIMIZER": "off"}, "fused_optimizer", "off", id="fused-off"
        ),
        pytest.param({}, "checkpoint", "off: no checkpoint directory", id="no-dir"),
        pytest.param(
            {"TRAINWAVE_FEATURE_CHECKPOINT": "on"},
            "checkpoint",
            "skipped: TRAINWAVE_CHECKPOINT_DIR is not set",
            id="on-without-dir",
        ),
        pytest.param(
            {"TRAINWAVE_CHECKPOINT_DIR": "/c", "TRAINWAVE_FEATURE_CHECKPOINT": "off"},
            "checkpoint",
            "off",
            id="dir-but-off",
        ),
    ],
)
def test_report_follows_the_environment(env, feature, expected):
    acc, _, _ = prepared(env)
    assert acc.report[feature].startswith(expected), acc.report[feature]
    assert "process_group" not in acc.report, "one process: no group to join"


def test_explicit_options_win_over_the_environment():
    env = {"TRAINWAVE_FEATURE_AMP": "on", "TRAINWAVE_INTER_NODE_GBPS": "5"}
    acc = Accelerator.from_settings(load_settings(env), modes={"amp": "off"}, inter_node_gbps=1.0)
    assert acc.modes["amp"] == "off"
    assert acc.distributor.inter_node_gbps == 1.0


def test_a_typo_in_the_environment_fails_prepare(monkeypatch):
    monkeypatch.setenv("TRAINWAVE_FEATURE_COMPRESION", "fp16")
    model = make_model()
    with pytest.raises(SettingsError, match="TRAINWAVE_FEATURE_COMPRESION='fp16': unknown feature"):
        accelerate.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))


def test_module_prepare_reads_os_environ(monkeypatch):
    monkeypatch.setenv("TRAINWAVE_FEATURE_AMP", "on")
    model = make_model()
    accelerate.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    assert accelerate.current().report["amp"] == "on: bf16 autocast (cpu)"


def test_world_size_without_rendezvous_address_is_refused(monkeypatch):
    for name in ("MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    model = make_model()
    with pytest.raises(ValueError, match="WORLD_SIZE=2 but MASTER_ADDR and MASTER_PORT not set"):
        accelerate.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))


def test_saves_when_due_and_resumes_into_a_fresh_model(tmp_path):
    env = {"TRAINWAVE_CHECKPOINT_DIR": str(tmp_path), "TRAINWAVE_CHECKPOINT_EVERY_STEPS": "3"}
    acc, model, opt = prepared(env)
    saved = train(acc, model, opt, range(7))
    assert [p.name if p else None for p in saved] == [
        None, None, "step-000000000003.pt", None, None, "step-000000000006.pt", None,
    ]  # fmt: skip
    assert acc.report["checkpoint"].startswith(f"on: every 3 steps into {tmp_path}, keep 3")

    fresh_acc, fresh, fresh_opt = prepared(env, seed=1)
    assert fresh_acc.resume() == 6
    # What step 7 did in the first run, the resumed one must do the same from step 6.
    train(acc, model, opt, range(7, 8))
    train(fresh_acc, fresh, fresh_opt, range(6, 8))
    for ours, theirs in zip(model.parameters(), fresh.parameters(), strict=True):
        torch.testing.assert_close(ours, theirs)


def test_counts_optimizer_steps_and_writes_each_due_step_once(tmp_path):
    env = {"TRAINWAVE_CHECKPOINT_DIR": str(tmp_path), "TRAINWAVE_CHECKPOINT_EVERY_STEPS": "2"}
    acc = Accelerator.from_settings(load_settings(env), gradient_accumulation_steps=2)
    model = make_model()
    model, opt, _ = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    written = []
    for micro in range(8):  # 4 optimizer steps of 2 micro-batches
        with acc.accumulate():
            acc.backward(model(torch.full((2, 8), float(micro))).square().mean())
            opt.step()
            opt.zero_grad()
        written.append(acc.save_checkpoint())
    assert acc.optimizer_steps == 4
    names = [p.name if p else None for p in written]
    assert names == [
        None,
        None,
        None,
        "step-000000000002.pt",
        None,
        None,
        None,
        "step-000000000004.pt",
    ]
    fresh = Accelerator.from_settings(load_settings(env))
    fresh_model = make_model(seed=3)
    fresh.prepare(fresh_model, torch.optim.SGD(fresh_model.parameters(), lr=0.1))
    assert fresh.resume() == 4
    assert fresh.optimizer_steps == 4
    assert fresh.save_checkpoint() is None, "the step just resumed from is not written again"


def test_forced_save_and_nothing_to_resume(tmp_path):
    acc, _, _ = prepared({"TRAINWAVE_CHECKPOINT_DIR": str(tmp_path)})
    assert acc.resume() == 0
    assert acc.save_checkpoint(1) is None, "no EVERY_STEPS: only forced saves"
    assert acc.save_checkpoint(1, force=True) == tmp_path / "step-000000000001.pt"


def test_checkpoint_lines_need_prepare_first(tmp_path):
    acc = Accelerator.from_settings(load_settings({"TRAINWAVE_CHECKPOINT_DIR": str(tmp_path)}))
    with pytest.raises(
        RuntimeError, match=r"call prepare\(model, optimizer, loader\) before resume"
    ):
        acc.resume()
