"""Warm starts: which commands fork from torch's forkserver, what it preloads, and what a
forked process puts right before the user's script runs (launch.py, launcher/warm*.py)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from trainwave import contract
from trainwave.runtime.launch import WARM_MODULE, child_command, warm_arguments
from trainwave.runtime.launcher import warm, warm_child

pytestmark = pytest.mark.timeout(30)
WARM_RUN = [sys.executable, "-m", WARM_MODULE]

SCRIPTS = {
    "script": (["train.py", "--lr", "1"], ["train.py", "--lr", "1"]),
    "python-script": (["python", "train.py", "--lr", "1"], ["train.py", "--lr", "1"]),
    "python3.11-unbuffered": (["/usr/bin/python3.11", "-u", "t.py"], ["t.py"]),
    "torchrun-options-kept": (["torchrun", "--nproc-per-node", "2", "t.py"], ["--nproc-per-node", "2", "t.py"]),
    "python-module": (["python", "-m", "pkg.train"], None),
    "python-other-flag": (["python", "-O", "train.py"], None),
    "python-inline": (["python", "-c", "print(1)"], None),
    "shell": (["bash", "run.sh"], None),
    "pythonic-name": (["pythonista", "train.py"], None),
}  # fmt: skip


@pytest.mark.parametrize(("command", "expected"), SCRIPTS.values(), ids=SCRIPTS.keys())
def test_which_commands_can_be_warm_started(command: list[str], expected: list[str] | None) -> None:
    assert warm_arguments(command) == expected
    built = child_command(command, 2, in_place=True, warm=True)
    if expected is None:  # as without warm starts: torchrun, or the user's own torchrun
        assert built == child_command(command, 2, in_place=True, warm=False)
    else:
        assert built == [*WARM_RUN, *expected]


def test_warm_starts_only_serve_in_place_restarts() -> None:
    command = ["python", "train.py"]
    assert child_command(command, 2, in_place=False, warm=True)[1:3] == [
        "-m",
        "torch.distributed.run",
    ]
    assert child_command(command, 1, in_place=False, warm=True) == command


def test_preload_is_torch_then_the_jobs_own_modules() -> None:
    assert warm.preload_modules({}) == list(warm.BASE_PRELOAD)
    extra = {contract.ENV_WARM_PRELOAD: " transformers, torch ,my_pkg.models,,"}
    assert warm.preload_modules(extra) == [*warm.BASE_PRELOAD, "transformers", "my_pkg.models"]


@pytest.mark.parametrize("bad", ["transformers;rm", "a..b", "9lives", "x y"])
def test_a_bad_preload_names_the_variable_and_the_entry(bad: str) -> None:
    with pytest.raises(ValueError, match=contract.ENV_WARM_PRELOAD) as error:
        warm.preload_modules({contract.ENV_WARM_PRELOAD: f"numpy,{bad}"})
    assert repr(bad) in str(error.value) or bad in str(error.value)


def parsed(script: Path, **fields: object) -> SimpleNamespace:
    base = {"no_python": False, "module": False, "start_method": "spawn"}
    return SimpleNamespace(training_script=str(script), **{**base, **fields})


def test_what_runs_cold_and_why(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("")
    assert warm.cold_reason(parsed(script), ["train.py"], {}) is None
    assert "--no-python" in str(warm.cold_reason(parsed(script, no_python=True), [], {}))
    assert "-m" in str(warm.cold_reason(parsed(script, module=True), [], {}))
    assert "not a file" in str(warm.cold_reason(parsed(tmp_path / "gone.py"), [], {}))
    chosen = warm.cold_reason(parsed(script), ["--start-method=spawn", "train.py"], {})
    assert "'spawn'" in str(chosen)
    from_env = warm.cold_reason(parsed(script, start_method="fork"), [], {"PET_START_METHOD": "1"})
    assert "'fork'" in str(from_env)
    forkserver = parsed(script, start_method="forkserver")
    assert warm.cold_reason(forkserver, ["--start_method", "forkserver"], {}) is None


def test_a_forked_process_names_itself_and_runs_the_script_as_main(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reports = tmp_path / "reports"
    monkeypatch.setenv(contract.ENV_REPORT_DIR, str(reports))
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))
    (tmp_path / "sibling.py").write_text("VALUE = 41\n")
    script = tmp_path / "train.py"
    out = tmp_path / "seen.json"
    script.write_text(
        "import json, sys, sibling\n"
        "if __name__ == '__main__':\n"
        f"    open({str(out)!r}, 'w').write(json.dumps([sys.argv, sibling.VALUE + 1]))\n"
    )
    warm_child.run(str(script), "--lr", "1")
    assert json.loads(out.read_text()) == [[str(script), "--lr", "1"], 42]
    written = json.loads(warm_child.identity_path(reports, os.getpid()).read_text())
    assert written == {"rank": "3", "generation": "2"}


def test_numpy_is_reseeded_as_a_fresh_import_would_be() -> None:
    numpy = pytest.importorskip("numpy")
    numpy.random.seed(7)
    first = numpy.random.random()
    numpy.random.seed(7)
    warm_child.reseed_numpy()
    assert numpy.random.random() != first


def test_the_agent_imports_ahead_once_the_first_generation_runs(tmp_path: Path) -> None:
    started = warm._first_generation_started({contract.ENV_REPORT_DIR: str(tmp_path)})
    assert not started()  # rendezvous: the agent's CPU is the gang's
    warm_child.record_identity({contract.ENV_REPORT_DIR: str(tmp_path), "RANK": "0"}, 7)
    assert started()
    assert warm._first_generation_started({})()  # no report directory: at once
