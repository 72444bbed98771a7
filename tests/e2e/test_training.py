"""End to end: TrainingJobs whose workers really train, in containers on the real node.

The operator (in-cluster, from the chart) places the gang on the real node and injects the
runtime (`spec.runtime`): the init container from `trainwave/runtime:0.1.0` copies it into
the worker, the launcher starts torchrun from the PET_* variables, and two processes per
worker train examples/train/regression_ddp.py with DDP over gloo across the two pods'
network namespaces. The workers find rank 0 through the headless Service's DNS name
(CoreDNS): MASTER_ADDR is a name, never an address.

The worker image is `trainwave/python:3.11-bookworm` (Debian's Python 3.11). torch comes
the way a user image would bring it; to avoid copying GBs into an image the test mounts
it: the cached virtualenv's site-packages (`sys.prefix`/lib/python3.11/site-packages of
the test's own venv) as a read-only hostPath at /usr/local/lib/python3.11/dist-packages,
which Debian's Python has on sys.path. The training script is mounted the same way, and
checkpoints go to a hostPath under the test's tmp dir (the node shares this machine's
filesystem). No GPU: gloo on CPUs; nothing here verifies NCCL, a GPU or an RDMA NIC.
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cluster.controlplane import Cluster
from e2e.conftest import ON_REAL_NODE, RUNTIME_IMAGE, WORKER_IMAGE, Release
from integration.trainwave_fixtures import (
    apply,
    env_of,
    job,
    job_manifest,
    wait_for_phase,
    wait_until,
    worker_pods,
)
from trainwave import contract

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "examples" / "train"
SITE_PACKAGES = Path(sys.prefix) / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
SITE_PACKAGES = SITE_PACKAGES / "site-packages"
CHECKPOINTS = "/checkpoints"  # where the workers see the hostPath directory


def read_only_host_path(name: str, path: Path, mount: str) -> tuple[dict[str, Any], dict[str, Any]]:
    volume = {"name": name, "hostPath": {"path": str(path), "type": "Directory"}}
    return volume, {"name": name, "mountPath": mount, "readOnly": True}


def training_job(
    name: str, checkpoints: Path, *, steps: int, every: int, step_seconds: float = 0.0
) -> dict[str, Any]:
    """2 workers x 2 processes with the runtime injected, pinned to the real node."""
    torch_volume, torch_mount = read_only_host_path(
        "torch", SITE_PACKAGES, "/usr/local/lib/python3.11/dist-packages"
    )
    scripts_volume, scripts_mount = read_only_host_path("scripts", SCRIPTS, "/scripts")
    worker = {
        "name": contract.WORKER_CONTAINER,
        "volumeMounts": [
            torch_mount,
            scripts_mount,
            {"name": "checkpoints", "mountPath": CHECKPOINTS},
        ],
    }
    return job_manifest(
        name,
        workers=2,
        gpus=2,
        result=None,
        image=WORKER_IMAGE,
        processesPerWorker=2,
        command=["python", "/scripts/regression_ddp.py"],
        args=["--step-seconds", str(step_seconds)],
        env=[
            {"name": contract.ENV_TELEMETRY_INTERVAL_SECONDS, "value": "1"},
            {"name": "OMP_NUM_THREADS", "value": "1"},
        ],
        runtime={
            "checkpoint": {"path": CHECKPOINTS, "everySteps": every, "keep": 3},
            "totalSteps": steps,
        },
        template_spec={
            "nodeSelector": ON_REAL_NODE,
            "containers": [worker],
            "volumes": [
                torch_volume,
                scripts_volume,
                {
                    "name": "checkpoints",
                    "hostPath": {"path": str(checkpoints), "type": "DirectoryOrCreate"},
                },
            ],
        },
    )


def pod_logs(cluster: Cluster, namespace: str, pod: str, container: str) -> str:
    return cluster.kubectl("logs", pod, "-n", namespace, "-c", container).stdout


def events(log: str, kind: str) -> list[dict[str, Any]]:
    """The training script's JSON lines of one kind, from a worker's log."""
    found = []
    for line in log.splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            if record.get("event") == kind and "logger" not in record:
                found.append(record)
    return found


def launcher_settings(log: str) -> dict[str, Any]:
    for line in log.splitlines():
        if '"trainwave.launch"' in line and '"settings"' in line:
            record: dict[str, Any] = json.loads(line)
            return record
    raise AssertionError(f"no launcher settings line in the worker's log:\n{log[-2000:]}")


def rank0(name: str, attempt: int) -> str:
    return f"{name}-a{attempt}-worker-0"


def checkpoint_steps(directory: Path) -> list[int]:
    return sorted(int(p.stem.removeprefix("step-")) for p in directory.glob("step-*.pt"))


def trainwave_logs(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    """The `trainwave logs` CLI as a user runs it: its own process, only a kubeconfig."""
    environment = os.environ | {
        "KUBECONFIG": str(cluster.kubeconfig),
        "PYTHONPATH": str(REPO / "operator"),
    }
    command = [sys.executable, "-c", "import sys; from trainwave.cli import main; sys.exit(main())"]
    return subprocess.run(
        [*command, "logs", *args],
        capture_output=True, text=True, env=environment, timeout=60, check=False,
    )  # fmt: skip


def is_address(value: str) -> bool:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True


@pytest.mark.timeout(420)
def test_gang_trains_with_ddp_and_succeeds(
    release: Release, namespace: str, tmp_path: Path
) -> None:
    cluster, steps = release.cluster, 40
    apply(cluster, namespace, training_job("ddp", tmp_path, steps=steps, every=20))

    done = wait_for_phase(cluster, namespace, "ddp", ("Succeeded", "Failed"), timeout=360)

    assert done["status"]["phase"] == "Succeeded", done["status"]
    # The gang that finished; a restarted one keeps its failed attempt's pods for their logs
    # (gloo has aborted a rank now and then on this loaded machine: a restart, then success).
    attempt = int(done["status"]["attempt"])
    pods = [p for p in worker_pods(cluster, namespace, "ddp")
            if p["metadata"]["labels"][contract.LABEL_ATTEMPT] == str(attempt)]  # fmt: skip
    assert [p["spec"]["nodeName"] for p in pods] == [release.node] * 2
    assert {p["status"]["phase"] for p in pods} == {"Succeeded"}
    # Rank 0 by its headless Service name, which only cluster DNS resolves.
    master = env_of(pods[0])[contract.ENV_MASTER_ADDR]
    assert not is_address(master), master
    assert master == "ddp-worker-0.ddp", master  # <hostname>.<headless Service>
    (installer,) = (c for c in pods[0]["spec"]["initContainers"]
                    if c["name"] == contract.RUNTIME_INIT_CONTAINER)  # fmt: skip
    assert installer["image"] == RUNTIME_IMAGE, installer
    name = rank0("ddp", attempt)
    installed = pod_logs(cluster, namespace, name, contract.RUNTIME_INIT_CONTAINER)
    assert "trainwave runtime installed in /opt/trainwave/trainwave" in installed
    log = pod_logs(cluster, namespace, name, contract.WORKER_CONTAINER)
    settings = launcher_settings(log)
    assert settings["settings"]["checkpoint"]["dir"] == CHECKPOINTS
    # in-place restarts are on by default, and with them warm starts: torchrun's agent with
    # each generation forked from a server that imported torch (runtime/launcher/warm.py)
    assert settings["command"][1:4] == [
        "-m",
        "trainwave.runtime.launcher.warm",
        "/scripts/regression_ddp.py",
    ]
    (start,) = events(log, "start")
    assert start["world_size"] == 4
    done_steps = [e["step"] for e in events(log, "step")]
    if attempt == 0:
        assert start["resumed_from"] == 0
        assert done_steps == list(range(1, steps + 1))
    else:  # the restarted gang resumed from a checkpoint and finished the count
        assert done_steps == list(range(start["resumed_from"] + 1, steps + 1))
    losses = [e["loss"] for e in events(log, "step")]
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    if attempt == 0:
        assert last < 0.5 * first, (
            f"loss did not go down enough: first 5 {first:.3f}, last 5 {last:.3f}"
        )
    assert checkpoint_steps(tmp_path) == [20, 40]
    # `trainwave logs`: the same lines, through the API server and the real kubelet.
    shown = trainwave_logs(cluster, "ddp", "-n", namespace, "--rank", "0")
    assert shown.returncode == 0, shown.stderr
    assert any(line.startswith("[rank 0] {") and '"event": "done"' in line
               for line in shown.stdout.splitlines()), shown.stdout[-2000:]  # fmt: skip


@pytest.mark.timeout(600)
def test_killed_worker_container_restarts_the_gang_from_the_latest_checkpoint(
    release: Release, namespace: str, tmp_path: Path
) -> None:
    cluster, steps, every = release.cluster, 120, 10
    manifest = training_job("resume", tmp_path, steps=steps, every=every, step_seconds=0.2)
    apply(cluster, namespace, manifest)
    wait_until(lambda: [s for s in checkpoint_steps(tmp_path) if s >= 2 * every], 300,
               "a second checkpoint of attempt 0")  # fmt: skip
    # Attempt 0's rank 0 as it was before the kill: its pod goes with the gang restart.
    before_kill = pod_logs(cluster, namespace, rank0("resume", 0), contract.WORKER_CONTAINER)

    saved_before_restart = checkpoint_steps(tmp_path)[-1]
    # SIGKILL at once (no grace): the container dies as an OOM kill would end it.
    victim = release.container_id(namespace, "resume-a0-worker-1", contract.WORKER_CONTAINER)
    release.crictl("stop", "--timeout", "0", victim)
    seen_in_attempt_0 = events(before_kill, "step")[-1]["step"]

    # The operator reads each worker's /status (the launcher, on the pod IP) and shows
    # rank 0's progress; a step past what attempt 0 was seen reaching, in attempt 1.
    def progress_of_attempt_1() -> dict[str, Any] | None:
        status = job(cluster, namespace, "resume").get("status", {})
        progress = status.get("progress") or {}
        step = progress.get("step") or 0
        return progress if status.get("attempt") == 1 and step > seen_in_attempt_0 else None

    progress = wait_until(progress_of_attempt_1, 240, "status.progress of attempt 1")
    assert progress["totalSteps"] == steps
    assert progress["loss"] is not None

    done = wait_for_phase(cluster, namespace, "resume", ("Succeeded", "Failed"), timeout=300)
    assert done["status"]["phase"] == "Succeeded", done["status"]
    assert (done["status"]["attempt"], done["status"]["restarts"]) == (1, 1)
    second = pod_logs(cluster, namespace, rank0("resume", 1), contract.WORKER_CONTAINER)
    (restart,) = events(second, "start")
    resumed = restart["resumed_from"]
    assert resumed >= saved_before_restart, restart
    assert resumed % every == 0, restart
    continued = [e["step"] for e in events(second, "step")]
    assert continued == list(range(resumed + 1, steps + 1))
    # Restored, not restarted: the loss picks up where attempt 0 left it.
    before = {e["step"]: e["loss"] for e in events(before_kill, "step")}
    after = events(second, "step")[0]["loss"]
    assert after < 0.5 * before[1], f"loss after resume {after} vs {before[1]} at step 1"
    assert checkpoint_steps(tmp_path)[-1] == steps
