"""In-place restarts with a real gloo process group: two launchers (two "workers" on this
host, one process each) under torch's elastic agent over c10d, as the operator starts them.

The training process all-reduces every step; rank 1 SIGKILLs itself in generation 0 and
again in generation 1, so the gang restarts in place twice and each new generation must
build a fresh process group. This is what broke on the real node before the launcher
turned off torchrun's shared rendezvous store (runtime/launcher/environment.py,
pytorch/pytorch#135712): the second generation read the first one's addresses.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from trainwave import contract

pytestmark = pytest.mark.timeout(240)
REPO = Path(__file__).resolve().parents[4]
STEPS = 12

TRAIN = """
import os, signal, sys, time
from datetime import timedelta
from pathlib import Path
import torch
import torch.distributed as dist

work = Path(sys.argv[1])
generation = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
dist.init_process_group("gloo", timeout=timedelta(seconds=60))
rank = dist.get_rank()
checkpoint = work / "checkpoint"
start = int(checkpoint.read_text()) if checkpoint.exists() else 0
for step in range(start + 1, STEPS + 1):
    value = torch.ones(1)
    dist.all_reduce(value)
    assert value.item() == dist.get_world_size()
    with (work / f"rank{rank}.log").open("a") as log:
        log.write(f"{step} {generation}\\n")
    time.sleep(0.3)  # each generation lives several of the launcher's 0.5 s looks at /proc
    if rank == 0 and step % 3 == 0:
        checkpoint.write_text(str(step))
    if rank == 1 and step == 4 + 3 * generation and generation < 2:
        os.kill(os.getpid(), signal.SIGKILL)
dist.destroy_process_group()
""".replace("STEPS", str(STEPS))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def launch(tmp_path: Path, node_rank: int, endpoint: str, **extra: str) -> subprocess.Popen[str]:
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(REPO / "operator"),
        "TRAINWAVE_REPORT_DIR": str(tmp_path / f"reports-{node_rank}"),
        "TRAINWAVE_PODINFO_DIR": str(tmp_path / "no-podinfo"),
        "TRAINWAVE_STATUS_HOST": "127.0.0.1",
        "TRAINWAVE_STATUS_PORT": "0",
        "TRAINWAVE_FEATURE_DOCTOR": "off",
        contract.ENV_PET_NNODES: "2",
        contract.ENV_PET_NPROC_PER_NODE: "1",
        contract.ENV_PET_RDZV_BACKEND: "c10d",
        contract.ENV_PET_RDZV_ENDPOINT: endpoint,
        contract.ENV_PET_RDZV_ID: "gloo-a0",
        contract.ENV_PET_MAX_RESTARTS: "3",
        # The operator's is_host: only node 0's agent serves the rendezvous store.
        "PET_RDZV_CONF": f"is_host={'true' if node_rank == 0 else 'false'}",
        "GLOO_SOCKET_IFNAME": "lo",
        "OMP_NUM_THREADS": "1",
        **extra,
    }
    command = [sys.executable, "-m", contract.RUNTIME_LAUNCHER, "--",
               sys.executable, str(tmp_path / "train.py"), str(tmp_path / "work")]  # fmt: skip
    return subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)


def run_gang(tmp_path: Path, **extra: str) -> tuple[list[int], list[str]]:
    (tmp_path / "train.py").write_text(TRAIN)
    (tmp_path / "work").mkdir()
    endpoint = f"127.0.0.1:{free_port()}"
    launchers = [launch(tmp_path, rank, endpoint, **extra) for rank in (0, 1)]
    errors = [launcher.communicate(timeout=220)[1] for launcher in launchers]
    return [launcher.returncode for launcher in launchers], errors


def restarts(stderr: str) -> list[dict[str, object]]:
    lines = (json.loads(line) for line in stderr.splitlines() if line.startswith('{"ts"'))
    return [line for line in lines if line.get("event") == "restart"]


@pytest.mark.skipif(not Path("/sys/class/net/lo").exists(), reason="no loopback interface")
def test_two_in_place_restarts_build_a_fresh_process_group_each_time(tmp_path: Path) -> None:
    codes, errors = run_gang(tmp_path)
    assert codes == [0, 0], "\n".join(error[-3000:] for error in errors)
    steps = [
        int(line.split()[0])
        for line in (tmp_path / "work" / "rank0.log").read_text().split("\n")
        if line
    ]
    assert steps[-1] == STEPS
    generations = {
        line.split()[1]
        for line in (tmp_path / "work" / "rank1.log").read_text().split("\n")
        if line
    }
    assert generations == {"0", "1", "2"}
    # Both launchers restarted twice. The one whose process held global rank 1 (c10d may
    # give it to either worker in each round) saw a failure; the other a "peer" restart,
    # or a failure of its own when its process died first on the broken collective.
    per_launcher = [[str(r["cause"]) for r in restarts(error)] for error in errors]
    assert [len(causes) for causes in per_launcher] == [2, 2], per_launcher
    assert sum(causes.count("failure") for causes in per_launcher) >= 2, per_launcher
    assert os.environ.get("TORCH_DISABLE_SHARE_RDZV_TCP_STORE") is None  # the launcher's own
