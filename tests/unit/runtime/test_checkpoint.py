"""Atomic checkpoints: round trip, keep-N, torn files ignored, a crash mid-write survived."""

from __future__ import annotations

import random
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from trainwave.runtime.checkpoint import Checkpointer, checkpoint_name, list_checkpoints
from trainwave.runtime.settings import load_settings

REPO = Path(__file__).resolve().parents[3]


def make_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))


def train_steps(model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: int) -> None:
    for _ in range(steps):
        loss = model(torch.randn(4, 8)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


class CountingSampler:
    def __init__(self) -> None:
        self.position = 0

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.position = state["position"]


def test_round_trip_restores_model_optimizer_sampler_and_rng(tmp_path: Path) -> None:
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    train_steps(model, optimizer, 3)
    sampler = CountingSampler()
    sampler.position = 42
    checkpointer = Checkpointer(tmp_path)
    checkpointer.save(3, model=model, optimizer=optimizer, sampler=sampler, extra={"epoch": 1})

    fresh = make_model(seed=1)
    fresh_optimizer = torch.optim.AdamW(fresh.parameters(), lr=0.01)
    fresh_sampler = CountingSampler()
    torch.manual_seed(999)
    step = checkpointer.resume(model=fresh, optimizer=fresh_optimizer, sampler=fresh_sampler)

    assert step == 3
    assert fresh_sampler.position == 42
    for ours, theirs in zip(model.state_dict().values(), fresh.state_dict().values(), strict=True):
        assert torch.equal(ours, theirs)
    assert (
        fresh_optimizer.state_dict()["state"][0]["step"]
        == optimizer.state_dict()["state"][0]["step"]
    )
    latest = checkpointer.latest()
    assert latest is not None
    assert latest.state["extra"] == {"epoch": 1}


def test_rng_streams_continue_after_resume(tmp_path: Path) -> None:
    model = make_model()
    checkpointer = Checkpointer(tmp_path)
    checkpointer.save(1, model=model)
    after_save = (torch.rand(4).tolist(), random.random())
    torch.manual_seed(7)
    random.seed(7)
    checkpointer.resume(model=model)
    assert (torch.rand(4).tolist(), random.random()) == after_save


def test_keeps_only_the_newest(tmp_path: Path) -> None:
    checkpointer = Checkpointer(tmp_path, keep=2)
    model = make_model()
    for step in (10, 20, 30, 40):
        checkpointer.save(step, model=model)
    assert [step for step, _ in list_checkpoints(tmp_path)] == [30, 40]


def test_no_checkpoint_resumes_at_zero(tmp_path: Path) -> None:
    assert Checkpointer(tmp_path / "absent").resume(model=make_model()) == 0


TORN = {
    "truncated": lambda data: data[: len(data) // 2],
    "empty": lambda data: b"",
    "garbage": lambda data: b"not a checkpoint" * 10,
}


@pytest.mark.parametrize("tear", TORN.values(), ids=TORN.keys())
def test_torn_newest_file_is_skipped(tmp_path: Path, tear: Callable[[bytes], bytes]) -> None:
    checkpointer = Checkpointer(tmp_path)
    model = make_model()
    checkpointer.save(1, model=model)
    good = (tmp_path / checkpoint_name(1)).read_bytes()
    (tmp_path / checkpoint_name(2)).write_bytes(tear(good))
    latest = checkpointer.latest()
    assert latest is not None
    assert latest.step == 1


def test_other_ranks_do_not_write(tmp_path: Path) -> None:
    assert Checkpointer(tmp_path, rank=1).save(5, model=make_model()) is None
    assert list_checkpoints(tmp_path) == []


CRASH = textwrap.dedent(
    """
    import os, signal, sys
    import torch
    from pathlib import Path
    from trainwave.runtime.checkpoint import Checkpointer

    directory = Path(sys.argv[1])
    model = torch.nn.Linear(512, 512)
    checkpointer = Checkpointer(directory)
    checkpointer.save(1, model=model)

    real_save = torch.save
    def dying_save(obj, stream, *args, **kwargs):
        # Write part of the real payload, make it reach the disk, then die
        # the way an OOM kill or a node loss ends a process: no cleanup.
        class Half:
            def __init__(self, inner): self.inner, self.written = inner, 0
            def write(self, data):
                self.inner.write(data); self.written += len(data)
                if self.written > 100_000:
                    self.inner.flush(); os.fsync(self.inner.fileno())
                    os.kill(os.getpid(), signal.SIGKILL)
                return len(data)
            def flush(self): self.inner.flush()
        real_save(obj, Half(stream), *args, **kwargs)
    torch.save = dying_save
    checkpointer.save(2, model=model)
    """
)


def test_crash_mid_write_leaves_the_previous_checkpoint(tmp_path: Path) -> None:
    env = {"PYTHONPATH": str(REPO / "operator"), "PATH": "/usr/bin:/bin"}
    process = subprocess.run(
        [sys.executable, "-c", CRASH, str(tmp_path)],
        check=False,
        env=env,
        capture_output=True,
        timeout=50,
    )
    assert process.returncode == -9, process.stderr.decode()[-2000:]
    leftovers = [path.name for path in tmp_path.iterdir()]
    assert any(name.startswith(".partial-") for name in leftovers), leftovers
    assert [step for step, _ in list_checkpoints(tmp_path)] == [1]

    checkpointer = Checkpointer(tmp_path)
    latest = checkpointer.latest()
    assert latest is not None
    assert latest.step == 1
    checkpointer.save(2, model=torch.nn.Linear(512, 512))
    assert not any(path.name.startswith(".partial-") for path in tmp_path.iterdir())


def test_from_settings() -> None:
    assert Checkpointer.from_settings(load_settings({})) is None
    off = {"TRAINWAVE_CHECKPOINT_DIR": "/c", "TRAINWAVE_FEATURE_CHECKPOINT": "off"}
    assert Checkpointer.from_settings(load_settings(off)) is None
    on = Checkpointer.from_settings(
        load_settings(
            {
                "TRAINWAVE_CHECKPOINT_DIR": "/c",
                "TRAINWAVE_CHECKPOINT_EVERY_STEPS": "100",
                "RANK": "3",
            }
        )
    )
    assert on is not None
    assert (on.directory, on.every_steps, on.rank) == (Path("/c"), 100, 3)
    assert on.due(200)
    assert not on.due(150)
    assert not on.due(0)
