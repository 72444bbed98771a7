"""Worker 0 replaced under a running gang: the other worker's launcher starts its agent again.

Two launchers on this host, as the operator starts two workers (one process each, torch's
elastic agent over c10d, worker 0 hosting the rendezvous store). After a few steps worker
0's launcher gets SIGTERM, as the kubelet sends when its pod is drained, and exits; a new
worker-0 launcher starts on the same endpoint, as the operator's replacement pod does. The
store died with the old worker 0, so worker 1's agent ends on RendezvousConnectionError;
its launcher must start the agent again (launcher/rejoin.py), which meets the new worker 0
in a fresh store, and the gang must resume from the checkpoint and finish, with worker 1's
launcher (the pod the operator keeps) never exiting.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from host.runtime.launcher.test_in_place_gloo import free_port, launch
from trainwave import contract

pytestmark = pytest.mark.timeout(300)
STEPS = 30

TRAIN = """
import os, sys, time
from datetime import timedelta
from pathlib import Path
import torch
import torch.distributed as dist

work = Path(sys.argv[1])
dist.init_process_group("gloo", timeout=timedelta(seconds=60))
rank = dist.get_rank()
checkpoint = work / "checkpoint"
start = int(checkpoint.read_text()) if checkpoint.exists() else 0
for step in range(start + 1, STEPS + 1):
    value = torch.ones(1)
    dist.all_reduce(value)
    with (work / f"rank{rank}.log").open("a") as log:
        log.write(f"{step} {os.getpid()}\\n")
    time.sleep(0.3)
    if rank == 0 and step % 3 == 0:
        checkpoint.write_text(str(step))
dist.destroy_process_group()
""".replace("STEPS", str(STEPS))


def events(stderr: str, name: str) -> list[dict[str, object]]:
    lines = (json.loads(line) for line in stderr.splitlines() if line.startswith('{"ts"'))
    return [line for line in lines if line.get("event") == name]


def logged(work: Path) -> set[tuple[int, int]]:
    """(step, pid) of every step either rank logged."""
    logs = [work / "rank0.log", work / "rank1.log"]
    return {(int(step), int(pid)) for log in logs if log.exists()
            for step, pid in (line.split() for line in log.read_text().splitlines() if line)}  # fmt: skip


STATUS_PORT = free_port()


def as_worker(tmp_path: Path, rank: int, replacement: bool = False) -> dict[str, str]:
    """What the operator gives each worker for announcements: the job's key, the same
    status port on each worker's own address (here a loopback address per worker), the
    address template, worker 0's pod IP, and whether the pod replaces its worker."""
    key = tmp_path / "key"
    key.write_text("ab" * 32)
    return {
        contract.ENV_STATUS_KEY_FILE: str(key),
        contract.ENV_STATUS_HOST: f"127.0.1.{rank}",
        contract.ENV_STATUS_PORT: str(STATUS_PORT),
        contract.ENV_WORKER_ADDRESS: "127.0.1.{rank}",
        contract.ENV_NODE_RANK: str(rank),
        contract.ENV_JOB_NAME: "gloo",
        contract.ENV_JOB_NAMESPACE: "default",
        contract.ENV_ATTEMPT: "0",
        **({contract.ENV_POD_IP: "127.0.0.1"} if rank == 0 else {}),
        **({contract.ENV_REPLACEMENT: "true"} if replacement else {}),
    }


def wait_for_step(work: Path, step: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while max((s for s, _ in logged(work)), default=0) < step:
        assert time.monotonic() < deadline, f"no step {step} in {timeout} s"
        time.sleep(0.2)


@pytest.mark.skipif(not Path("/sys/class/net/lo").exists(), reason="no loopback interface")
@pytest.mark.parametrize(
    ("warm", "how"), [("auto", "in process"), ("off", "new process")], ids=["warm", "cold"]
)
def test_worker_0_replaced_the_other_launcher_rejoins_and_the_gang_finishes(
    tmp_path: Path, warm: str, how: str
) -> None:
    (tmp_path / "train.py").write_text(TRAIN)
    work = tmp_path / "work"
    work.mkdir()
    endpoint = f"127.0.0.1:{free_port()}"
    mode = {"TRAINWAVE_FEATURE_WARM_START": warm}
    first = launch(tmp_path, 0, endpoint, **as_worker(tmp_path, 0), **mode)
    survivor = launch(tmp_path, 1, endpoint, **as_worker(tmp_path, 1), **mode)
    wait_for_step(work, 7, timeout=150)
    first.send_signal(signal.SIGTERM)  # the kubelet stopping worker 0's pod
    try:
        first_err = first.communicate(timeout=30)[1]
    except subprocess.TimeoutExpired:
        first.kill()  # the grace period ran out
        first_err = first.communicate()[1]
    before = logged(work)
    lost_at = max(step for step, _ in before)
    time.sleep(2)  # the replacement pod is created and starts
    second = launch(tmp_path, 0, endpoint, **as_worker(tmp_path, 0, replacement=True), **mode)
    second_err = second.communicate(timeout=200)[1]
    survivor_err = survivor.communicate(timeout=60)[1]
    logs = "\n---\n".join(e[-4000:] for e in (first_err, second_err, survivor_err))
    assert (second.returncode, survivor.returncode) == (0, 0), logs
    rejoins = events(survivor_err, "rejoin")
    assert len(rejoins) == 1, logs
    assert str(rejoins[0]["error"]).startswith("RendezvousConnectionError:"), rejoins
    # A warm-started agent runs torch's agent again in its own process (its forkserver
    # kept); a cold one is started again by the launcher.
    assert rejoins[0]["how"] == how, rejoins
    assert not events(second_err, "rejoin")  # the store's host never rejoins
    # The new worker 0 told the survivor where its store is, and the survivor's agent
    # started again on that address, not on a name looked up again (launcher/announce.py).
    assert not events(first_err, "store-announced")  # a gang's start announces nothing
    (announced,) = events(second_err, "store-announced")
    assert (announced["peers"], announced["reached"]) == (1, 1), announced
    (reached,) = events(survivor_err, "store-reachable")
    assert reached["via"] == "announced address", reached
    after = logged(work) - before
    new_pids = {pid for _, pid in after} - {pid for _, pid in before}
    resumed = sorted(step for step, pid in after if pid in new_pids)
    # The new gang resumed from the last checkpoint (every 3 steps), not from step 1, and
    # ran every step from there to the end.
    assert lost_at - 4 <= resumed[0] <= lost_at + 1, (lost_at, resumed[:4])
    assert set(range(resumed[0], STEPS + 1)) <= set(resumed)
