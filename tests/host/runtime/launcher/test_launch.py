"""The launcher: command building, pod annotations, zero-code features, and a real supervised child."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from trainwave import contract
from trainwave.runtime.data.loader_defaults import LoaderDefaults, cuda_present
from trainwave.runtime.launch import child_command
from trainwave.runtime.launcher import environment
from trainwave.runtime.launcher.podinfo import (
    PodInfoError,
    parse_annotations,
    unquote_go,
    worker_env,
)
from trainwave.runtime.settings import load_settings

REPO = Path(__file__).resolve().parents[4]
RUN = [sys.executable, "-m", "torch.distributed.run"]

COMMANDS = {
    "single-process-runs-as-is": (["python", "train.py", "--lr", "1"], 1, ["python", "train.py", "--lr", "1"]),
    "script-under-torchrun": (["train.py", "--lr", "1"], 8, [*RUN, "train.py", "--lr", "1"]),
    "python-command-no-python": (["python", "-u", "train.py"], 4, [*RUN, "--no-python", "python", "-u", "train.py"]),
    "user-already-uses-torchrun": (["torchrun", "train.py"], 8, ["torchrun", "train.py"]),
}  # fmt: skip


@pytest.mark.parametrize(("command", "nproc", "expected"), COMMANDS.values(), ids=COMMANDS.keys())
def test_child_command(command: list[str], nproc: int, expected: list[str]) -> None:
    assert child_command(command, nproc) == expected


def test_in_place_restarts_run_one_process_under_torchrun_too() -> None:
    command = ["python", "train.py"]
    assert child_command(command, 1, in_place=True) == [*RUN, "--no-python", *command]
    assert child_command(["torchrun", "train.py"], 1, in_place=True) == ["torchrun", "train.py"]


QUOTED = {
    "plain": ('"rack-00"', "rack-00"),
    "json-with-quotes": ('"{\\"NCCL_IB_HCA\\":\\"=mlx5_0:1\\"}"', '{"NCCL_IB_HCA":"=mlx5_0:1"}'),
    "newline-tab": ('"a\\nb\\tc"', "a\nb\tc"),
    "utf8-bytes": ('"caf\\xc3\\xa9"', "café"),
    "unicode": ('"\\u00e9"', "é"),
}


@pytest.mark.parametrize(("quoted", "expected"), QUOTED.values(), ids=QUOTED.keys())
def test_unquote_go(quoted: str, expected: str) -> None:
    assert unquote_go(quoted) == expected


def test_annotations_file_and_worker_env() -> None:
    text = (
        'kubernetes.io/config.seen="2026-11-22T01:02:03Z"\n'
        f'{contract.ANNOTATION_WORKER_ENV}="{{\\"NCCL_IB_HCA\\":\\"=mlx5_2:1\\",\\"NCCL_IB_GID_INDEX\\":\\"3\\"}}"\n'
    )
    annotations = parse_annotations(text)
    assert worker_env(annotations) == {"NCCL_IB_HCA": "=mlx5_2:1", "NCCL_IB_GID_INDEX": "3"}


BAD_ENV = {
    "not-json": ("{oops", "not JSON"),
    "not-strings": ('{"NCCL_IB_HCA": 3}', "string names to string values"),
}


@pytest.mark.parametrize(("raw", "message"), BAD_ENV.values(), ids=BAD_ENV.keys())
def test_bad_worker_env_names_the_annotation(raw: str, message: str) -> None:
    with pytest.raises(PodInfoError, match=message) as error:
        worker_env({contract.ANNOTATION_WORKER_ENV: raw})
    assert contract.ANNOTATION_WORKER_ENV in str(error.value)


def test_unquoted_annotation_line_is_refused() -> None:
    with pytest.raises(PodInfoError, match="line 1"):
        parse_annotations("key=value\n")


DEFAULTS = LoaderDefaults(2, False, True, 4)
TF32 = {
    "no-cuda": ({}, environment.Machine(cuda=False), "skipped: no CUDA", {}),
    "auto-ampere": ({}, environment.Machine(cuda=True, capability=(8, 0)), "on:", {environment.TORCH_TF32_OVERRIDE: "1"}),
    "auto-volta": ({}, environment.Machine(cuda=True, capability=(7, 0)), "skipped: compute capability 7.0", {}),
    "auto-unknown": ({}, environment.Machine(cuda=True), "skipped: GPU compute capability unknown", {}),
    "off": ({"TRAINWAVE_FEATURE_TF32": "off"}, environment.Machine(cuda=True, capability=(9, 0)), "off", {environment.NVIDIA_TF32_OVERRIDE: "0"}),
}  # fmt: skip


@pytest.mark.parametrize(("env", "machine", "state", "expected"), TF32.values(), ids=TF32.keys())
def test_tf32_policy(
    env: dict[str, str], machine: environment.Machine, state: str, expected: dict[str, str]
) -> None:
    prepared = environment.prepare(load_settings(env), machine, DEFAULTS, env, {})
    assert prepared.states["tf32"].startswith(state)
    tf32_vars = {k: v for k, v in prepared.env.items() if "TF32" in k}
    assert tf32_vars == expected


def test_prepare_keeps_user_values_and_reports_every_feature() -> None:
    env = {"TRAINWAVE_LOADER_NUM_WORKERS": "0", "NCCL_DEBUG": "WARN"}
    prepared = environment.prepare(
        load_settings(env),
        environment.Machine(cuda=False),
        DEFAULTS,
        env,
        {"NCCL_IB_HCA": "=mlx5_0"},
    )
    assert contract.ENV_LOADER_NUM_WORKERS not in prepared.env
    assert prepared.env[contract.ENV_LOADER_PREFETCH_FACTOR] == "4"
    assert "NCCL_DEBUG_FILE" not in prepared.env  # the user chose NCCL's logging
    assert prepared.env["NCCL_IB_HCA"] == "=mlx5_0"
    # main() adds the two that depend on more than the environment: the doctor's verdict
    # and whether the command can be warm-started
    assert set(contract.RUNTIME_FEATURES) - {"doctor", "warm_start"} <= set(prepared.states)


CHILD = """
import json, os, signal, sys, time
from pathlib import Path
report = Path(os.environ["TRAINWAVE_REPORT_DIR"])
seen = {k: os.environ.get(k) for k in ("NCCL_IB_HCA", "TRAINWAVE_LOADER_NUM_WORKERS", "NCCL_DEBUG_FILE")}
(report / "progress-rank0.json").write_text(json.dumps({"rank": 0, "step": 7, "seen": seen}))
signal.signal(signal.SIGTERM, lambda *_: sys.exit(7))
print("child ready", flush=True)
time.sleep(40)
sys.exit(1)
"""


def launcher_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    podinfo = tmp_path / "podinfo"
    podinfo.mkdir(exist_ok=True)
    (podinfo / "annotations").write_text(
        f'{contract.ANNOTATION_WORKER_ENV}="{{\\"NCCL_IB_HCA\\":\\"=mlx5_9:1\\"}}"\n'
    )
    return {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": str(REPO / "operator"),
        "TRAINWAVE_PODINFO_DIR": str(podinfo),
        "TRAINWAVE_REPORT_DIR": str(tmp_path / "reports"),
        "TRAINWAVE_STATUS_HOST": "127.0.0.1",
        "TRAINWAVE_STATUS_PORT": "0",
        **extra,
    }


def read_event(process: subprocess.Popen[str], event: str) -> dict[str, object]:
    assert process.stderr is not None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        if line.startswith("{") and json.loads(line)["event"] == event:
            return json.loads(line)
    raise AssertionError(f"no {event} line from the launcher")


def test_supervises_serves_status_and_forwards_sigterm(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "trainwave.runtime.launch", "--", sys.executable, "-c", CHILD]
    process = subprocess.Popen(
        command,
        env=launcher_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        settings = read_event(process, "settings")
        assert process.stdout is not None
        assert process.stdout.readline().strip() == "child ready"
        features = settings["features"]
        assert isinstance(features, dict)
        assert set(contract.RUNTIME_FEATURES) <= set(features)
        if not cuda_present():
            assert features["tf32"] == "skipped: no CUDA"
        url = f"http://127.0.0.1:{settings['status_port']}{contract.STATUS_PATH}"
        with urllib.request.urlopen(url, timeout=10) as response:
            status = json.load(response)
        assert status["child"]["running"] is True
        assert status["doctor"]["verdict"] in ("PASS", "WARN", "FAIL")
        seen = status["progress"]["seen"]
        assert seen["NCCL_IB_HCA"] == "=mlx5_9:1"
        assert int(seen["TRAINWAVE_LOADER_NUM_WORKERS"]) >= 1
        assert seen["NCCL_DEBUG_FILE"].startswith(str(tmp_path / "reports"))
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 7
        assert read_event(process, "exited")["exit_code"] == 7
    finally:
        process.kill()
        process.wait()


def test_bad_setting_stops_before_the_child(tmp_path: Path) -> None:
    env = launcher_env(tmp_path, TRAINWAVE_FEATURE_AMP="maybe")
    done = subprocess.run(
        [sys.executable, "-m", "trainwave.runtime.launch", "true"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 2
    assert "TRAINWAVE_FEATURE_AMP='maybe'" in done.stderr


def test_doctor_on_refuses_a_broken_fabric(tmp_path: Path) -> None:
    # NCCL_IB_HCA promises RDMA this machine does not have: rdma_devices FAILs.
    env = launcher_env(tmp_path, TRAINWAVE_FEATURE_DOCTOR="on", NCCL_IB_HCA="mlx5_0")
    (tmp_path / "podinfo/annotations").write_text("")
    done = subprocess.run(
        [sys.executable, "-m", "trainwave.runtime.launch", "touch", str(tmp_path / "ran")],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 3, done.stderr
    assert "doctor-failed" in done.stderr
    assert not (tmp_path / "ran").exists()
    assert json.loads((tmp_path / "reports/doctor.json").read_text())["verdict"] == "FAIL"


RANK_CHILD = """
import os
from pathlib import Path
Path(os.environ["OUT"], "rank" + os.environ["LOCAL_RANK"]).write_text(os.environ["WORLD_SIZE"])
"""


@pytest.mark.timeout(120)
def test_more_than_one_process_per_node_runs_under_torchrun(tmp_path: Path) -> None:
    env = launcher_env(
        tmp_path, PET_NPROC_PER_NODE="2", PET_NNODES="1", PET_STANDALONE="1", OUT=str(tmp_path)
    )
    command = [sys.executable, "-m", "trainwave.runtime.launch", sys.executable, "-c", RANK_CHILD]
    done = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=110, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.glob("rank*")) == ["rank0", "rank1"]
    assert (tmp_path / "rank1").read_text() == "2"


def test_in_place_restarts_step_aside_where_torch_is_missing() -> None:
    # A worker image without torch (the e2e tier's restricted job runs `python -c`):
    # the command runs as is instead of failing under torch.distributed.run.
    from trainwave.runtime.launch import NO_TORCH, in_place_where_possible
    from trainwave.runtime.settings import InPlace

    settings = load_settings({})
    on = dataclasses.replace(settings, in_place=InPlace(enabled=True, max_restarts=3))
    kept = in_place_where_possible(on, lambda: True)
    assert kept.in_place.enabled
    off = in_place_where_possible(on, lambda: False)
    assert not off.in_place.enabled
    assert off.in_place.reason == NO_TORCH
    command = ["python", "-c", "print(1)"]
    assert child_command(command, 1, in_place=off.in_place.enabled) == command


def test_a_bad_warm_preload_stops_the_launcher_naming_it(tmp_path: Path) -> None:
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(REPO / "operator"),
        "TRAINWAVE_REPORT_DIR": str(tmp_path / "reports"),
        "TRAINWAVE_PODINFO_DIR": str(tmp_path / "no-podinfo"),
        "TRAINWAVE_FEATURE_DOCTOR": "off",
        contract.ENV_PET_RDZV_BACKEND: contract.RDZV_BACKEND,
        contract.ENV_PET_MAX_RESTARTS: "1",
        contract.ENV_WARM_PRELOAD: "numpy,not a module",
    }
    command = [sys.executable, "-m", contract.RUNTIME_LAUNCHER, "--", "python", "train.py"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2, done.stderr[-2000:]
    assert contract.ENV_WARM_PRELOAD in done.stderr
    assert "'not a module'" in done.stderr
    assert '"event": "settings"' not in done.stderr  # nothing started
