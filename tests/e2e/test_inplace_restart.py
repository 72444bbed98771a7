"""End to end: in-place restarts and the hang watchdog on the real node (issue 26).

The job of test_training.py (2 workers x 2 processes, DDP over gloo, checkpoints on a
hostPath) with the runtime's in-place restarts (`spec.runtime.inPlaceRestarts`, default 3).
The test finds ONE training process from the host, through /proc: the node's containers
share this machine's pid namespace. The runtime warm-starts the processes (the default
`features.warmStart: auto`): each is forked from the agent's forkserver and names its rank
in a file under its report directory (training_process below). Then:

- SIGKILL it: the pods stay (same UIDs, attempt 0), torch's elastic agents restart every
  process of the gang in place, training resumes from the newest checkpoint and the job
  Succeeds; the killed worker's launcher logs one restart with cause "failure".
- SIGSTOP it with `hangTimeoutSeconds: 20`: the launchers' watchdog kills the stalled
  processes, the gang restarts in place with cause "hang", and the job Succeeds.
- the same kill with `inPlaceRestarts: 0`: today's gang recreation, as the baseline.

Each test prints the seconds from the fault to the gang's first completed step after it
(rank 0's step lines, timestamped by the kubelet): the figures in docs/goodput.md.
"""

from __future__ import annotations

import json
import os
import signal
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from benchmarks.fault_injection import FORKSERVER, warm_rank
from e2e.conftest import Release
from e2e.test_training import checkpoint_steps, events, training_job
from integration.trainwave_fixtures import apply, job, wait_for_phase, wait_until, worker_pods
from trainwave import contract

STEPS, EVERY = 80, 10
HANG_TIMEOUT = 20


def training_process(namespace: str, name: str, rank: int) -> int:
    """The pid of global rank `rank`'s training process of job namespace/name, from /proc:
    started by torchrun (RANK and TORCHELASTIC_RESTART_COUNT in its environment), or
    warm-started, forked from the agent's forkserver, which keeps the server's command line
    and environment and names its rank in a file (runtime/launcher/warm_child.py)."""
    wanted = {contract.ENV_JOB_NAME: name, contract.ENV_JOB_NAMESPACE: namespace}
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            raw = Path(f"/proc/{entry}/environ").read_bytes()
            command = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        pairs = raw.decode(errors="replace").split("\0")
        env = dict(item.split("=", 1) for item in pairs if "=" in item)
        if not all(env.get(k) == v for k, v in wanted.items()):
            continue
        if FORKSERVER in command:
            if warm_rank(Path(f"/proc/{entry}"), set(pairs)) == rank:
                found.append(int(entry))
        elif "TORCHELASTIC_RESTART_COUNT" in env and env.get(contract.ENV_RANK) == str(rank):
            found.append(int(entry))
    assert len(found) == 1, f"training processes of rank {rank} of {namespace}/{name}: {found}"
    return found[0]


def in_place_job(
    name: str, checkpoints: Path, *, restarts: int = 3, hang: int | None = None
) -> dict[str, Any]:
    manifest = training_job(name, checkpoints, steps=STEPS, every=EVERY, step_seconds=0.2)
    manifest["spec"]["runtime"]["inPlaceRestarts"] = restarts
    if hang is not None:
        manifest["spec"]["runPolicy"]["hangTimeoutSeconds"] = hang
    return manifest


def timestamped_log(release: Release, namespace: str, pod: str) -> list[tuple[float, str]]:
    """The worker container's lines with the kubelet's timestamps (this machine's clock)."""
    out = release.cluster.kubectl(
        "logs", pod, "-n", namespace, "-c", contract.WORKER_CONTAINER, "--timestamps"
    ).stdout
    lines = []
    for line in out.splitlines():
        stamp, _, text = line.partition(" ")
        lines.append((datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp(), text))
    return lines


def first_step_after(lines: list[tuple[float, str]], fault: float) -> tuple[float, int]:
    """When rank 0 logged the first step of the run that started after `fault`."""
    restarted = False
    for stamp, text in lines:
        if not text.startswith("{") or stamp < fault:
            continue
        record = json.loads(text)
        if record.get("event") == "start" and "logger" not in record:
            restarted = True
        elif restarted and record.get("event") == "step" and "logger" not in record:
            return stamp, int(record["step"])
    raise AssertionError("rank 0 logged no step after the fault and a new start")


def launcher_events(lines: list[tuple[float, str]], kind: str) -> list[dict[str, Any]]:
    found = []
    for _, text in lines:
        if text.startswith("{") and '"trainwave.launch"' in text:
            record = json.loads(text)
            if record.get("event") == kind:
                found.append(record)
    return found


def start_and_wait_for_checkpoint(
    release: Release, namespace: str, name: str, manifest: dict[str, Any], tmp_path: Path
) -> dict[str, str]:
    apply(release.cluster, namespace, manifest)
    wait_until(lambda: [s for s in checkpoint_steps(tmp_path) if s >= 2 * EVERY], 300,
               "a second checkpoint")  # fmt: skip
    return {p["metadata"]["name"]: p["metadata"]["uid"]
            for p in worker_pods(release.cluster, namespace, name)}  # fmt: skip


def assert_resumed_in_the_same_pods(
    release: Release, namespace: str, name: str, uids: dict[str, str], saved: int
) -> list[tuple[float, str]]:
    done = wait_for_phase(release.cluster, namespace, name, ("Succeeded", "Failed"), timeout=300)
    assert done["status"]["phase"] == "Succeeded", done["status"]
    if done["status"]["attempt"] != 0:  # say why: the first attempt's pods stay, for logs
        for rank in (0, 1):
            lines = timestamped_log(release, namespace, f"{name}-a0-worker-{rank}")
            print(f"--- {name}-a0-worker-{rank}\n" + "\n".join(t for _, t in lines[-60:]))
    assert done["status"]["attempt"] == 0, done["status"]  # no new attempt: no recreation
    after = {p["metadata"]["name"]: p["metadata"]["uid"]
             for p in worker_pods(release.cluster, namespace, name)}  # fmt: skip
    assert after == uids, "the pods were recreated"
    log = timestamped_log(release, namespace, f"{name}-a0-worker-0")
    starts = events("\n".join(text for _, text in log), "start")
    assert len(starts) == 2, starts  # one per generation, in the same container
    assert starts[1]["resumed_from"] >= saved, (starts[1], saved)
    assert checkpoint_steps_done(log) == STEPS
    return log


def checkpoint_steps_done(log: list[tuple[float, str]]) -> int:
    done = events("\n".join(text for _, text in log), "done")
    return int(done[-1]["steps"]) if done else -1


@pytest.mark.timeout(600)
def test_a_killed_training_process_restarts_the_gang_in_place(
    release: Release, namespace: str, tmp_path: Path
) -> None:
    name = "inplace"
    uids = start_and_wait_for_checkpoint(
        release, namespace, name, in_place_job(name, tmp_path), tmp_path
    )
    saved = checkpoint_steps(tmp_path)[-1]
    victim = training_process(namespace, name, rank=3)  # on worker 1
    fault = time.time()
    os.kill(victim, signal.SIGKILL)

    log = assert_resumed_in_the_same_pods(release, namespace, name, uids, saved)
    first_at, first_step = first_step_after(log, fault)
    print(f"in place: kill -> first new step {first_step} in {first_at - fault:.1f} s")
    killed_worker = timestamped_log(release, namespace, f"{name}-a0-worker-1")
    (settings,) = launcher_events(killed_worker, "settings")
    assert settings["features"]["warm_start"].startswith("auto: each generation forked")
    (restart,) = launcher_events(killed_worker, "restart")
    assert (restart["count"], restart["cause"]) == (1, "failure"), restart
    (resumed,) = launcher_events(killed_worker, "resumed")
    assert resumed["resumed_from"] >= saved, resumed
    print(f"in place: the launcher's fault -> first step {resumed['seconds_from_fault']} s")
    # The operator saw nothing to recreate: no restart was counted against maxRestarts.
    assert job(release.cluster, namespace, name)["status"].get("restarts", 0) == 0


@pytest.mark.timeout(600)
def test_a_stopped_training_process_is_a_hang_repaired_in_place(
    release: Release, namespace: str, tmp_path: Path
) -> None:
    name = "hang"
    manifest = in_place_job(name, tmp_path, hang=HANG_TIMEOUT)
    uids = start_and_wait_for_checkpoint(release, namespace, name, manifest, tmp_path)
    saved = checkpoint_steps(tmp_path)[-1]
    victim = training_process(namespace, name, rank=3)
    fault = time.time()
    os.kill(victim, signal.SIGSTOP)

    log = assert_resumed_in_the_same_pods(release, namespace, name, uids, saved)
    first_at, first_step = first_step_after(log, fault)
    print(f"hang: SIGSTOP -> first new step {first_step} in {first_at - fault:.1f} s "
          f"(timeout {HANG_TIMEOUT} s)")  # fmt: skip
    stopped_worker = timestamped_log(release, namespace, f"{name}-a0-worker-1")
    (hang,) = launcher_events(stopped_worker, "hang")
    assert hang["states"]["3"] == "stopped", hang
    detected = hang["ts"] - fault
    assert HANG_TIMEOUT - 3 <= detected <= HANG_TIMEOUT + 10, detected
    print(f"hang: detected {detected:.1f} s after the SIGSTOP")
    (restart,) = launcher_events(stopped_worker, "restart")
    assert restart["cause"] == "hang", restart


@pytest.mark.timeout(600)
def test_without_in_place_restarts_a_killed_process_recreates_the_gang(
    release: Release, namespace: str, tmp_path: Path
) -> None:
    """The baseline: today's behaviour (inPlaceRestarts: 0), same job, same fault."""
    name = "recreate"
    manifest = in_place_job(name, tmp_path, restarts=0)
    start_and_wait_for_checkpoint(release, namespace, name, manifest, tmp_path)
    victim = training_process(namespace, name, rank=3)
    fault = time.time()
    os.kill(victim, signal.SIGKILL)

    done = wait_for_phase(release.cluster, namespace, name, ("Succeeded", "Failed"), timeout=400)
    assert done["status"]["phase"] == "Succeeded", done["status"]
    assert done["status"]["attempt"] == 1, done["status"]
    log = timestamped_log(release, namespace, f"{name}-a1-worker-0")
    first_at, first_step = first_step_after(log, fault)
    print(f"recreation: kill -> first new step {first_step} in {first_at - fault:.1f} s")
