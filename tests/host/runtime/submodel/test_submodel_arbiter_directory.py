"""The arbiter as the agent's DaemonSet runs it: one socket per shared GPU the agent lists."""

from __future__ import annotations

import json
import os
import signal
import socket as sockets
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainwave.agent.running import write_arbiter_gpus
from trainwave.hardware.inventory import GpuInfo
from trainwave.runtime.submodel.arbiter import ArbiterClient, read_gpus

pytestmark = pytest.mark.timeout(60)
OPERATOR = Path(__file__).parents[4] / "operator"


def gpu(index: int, mib: int) -> GpuInfo:
    return GpuInfo(index, f"GPU-{index}", "H100", mib, f"0000:1{index}:00.0", None)


def wait_for(path: Path, seconds: float = 15.0) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def test_the_agent_writes_the_shared_gpus_once_and_atomically(tmp_path: Path) -> None:
    gpus = [gpu(0, 1024), gpu(1, 2048)]
    assert write_arbiter_gpus(tmp_path, gpus)
    assert not write_arbiter_gpus(tmp_path, gpus), "unchanged: not rewritten"
    assert read_gpus(tmp_path) == {"GPU-0": 1024 << 20, "GPU-1": 2048 << 20}
    assert [p.name for p in tmp_path.iterdir()] == ["gpus.json"]


def test_a_bad_gpus_file_names_the_file_and_what_is_accepted(tmp_path: Path) -> None:
    (tmp_path / "gpus.json").write_text(json.dumps({"GPU-0": -1}))
    with pytest.raises(ValueError, match=r"gpus.json: got .*expected an object of GPU UUID"):
        read_gpus(tmp_path)


def test_the_arbiter_serves_a_socket_per_listed_gpu_that_any_user_can_reach(
    tmp_path: Path,
) -> None:
    write_arbiter_gpus(tmp_path, [gpu(0, 1)])
    server = subprocess.Popen(
        [sys.executable, "-m", "trainwave.runtime.submodel.arbiter", "--directory", str(tmp_path)],
        env={"PYTHONPATH": str(OPERATOR)},
        stderr=subprocess.DEVNULL,
    )
    try:
        socket = tmp_path / "GPU-0.sock"
        wait_for(socket)
        assert stat.S_IMODE(socket.stat().st_mode) == 0o666
        client = ArbiterClient(str(socket), job="probe")
        assert client.status()["capacity"] == 1 << 20
        client.close()
        write_arbiter_gpus(tmp_path, [gpu(0, 1), gpu(1, 2)])  # a GPU offered later
        wait_for(tmp_path / "GPU-1.sock")
    finally:
        server.kill()
        server.wait()


def wait_gone(path: Path, seconds: float = 15.0) -> None:
    deadline = time.monotonic() + seconds
    while path.exists():
        assert time.monotonic() < deadline, f"{path} is still there"
        time.sleep(0.05)


def test_sockets_of_gpus_no_longer_listed_are_removed(tmp_path: Path) -> None:
    """Left by an earlier arbiter (the node shared another GPU then), or dropped from the
    list while this one runs: nobody serves them, so they go."""
    stale = sockets.socket(sockets.AF_UNIX)
    stale.bind(str(tmp_path / "GPU-9.sock"))
    stale.close()
    write_arbiter_gpus(tmp_path, [gpu(0, 1)])
    server = subprocess.Popen(
        [sys.executable, "-m", "trainwave.runtime.submodel.arbiter", "--directory", str(tmp_path)],
        env={"PYTHONPATH": str(OPERATOR)},
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(tmp_path / "GPU-0.sock")
        wait_gone(tmp_path / "GPU-9.sock")
        write_arbiter_gpus(tmp_path, [gpu(1, 2)])
        wait_for(tmp_path / "GPU-1.sock")
        wait_gone(tmp_path / "GPU-0.sock")
        assert sorted(p.name for p in tmp_path.iterdir()) == ["GPU-1.sock", "gpus.json"]
    finally:
        server.kill()
        server.wait()


def test_the_arbiter_as_pid_1_stops_at_sigterm(tmp_path: Path) -> None:
    """In the agent pod's container the arbiter is PID 1, which the kernel sends no signal
    it has no handler for: without one, the kubelet's SIGTERM is ignored and every stop of
    the pod waits its whole grace period. Here it is PID 1 of a PID namespace of its own."""
    write_arbiter_gpus(tmp_path, [gpu(0, 1)])
    holder = subprocess.Popen(
        ["unshare", "--user", "--map-root-user", "--pid", "--fork", sys.executable, "-m",
         "trainwave.runtime.submodel.arbiter", "--directory", str(tmp_path)],
        env={"PYTHONPATH": str(OPERATOR)}, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    arbiter = 0
    try:
        wait_for(tmp_path / "GPU-0.sock")
        children = Path(f"/proc/{holder.pid}/task/{holder.pid}/children").read_text().split()
        (arbiter,) = map(int, children)
        assert "\t1" in Path(f"/proc/{arbiter}/status").read_text().split("NSpid:")[1]
        os.kill(arbiter, signal.SIGTERM)
        assert holder.wait(timeout=10) == 0, "the arbiter did not exit cleanly at SIGTERM"
    finally:
        if holder.poll() is None:  # ignored: SIGKILL, which PID 1 cannot ignore
            if arbiter:
                os.kill(arbiter, signal.SIGKILL)
            holder.kill()
            holder.wait()
