"""End to end: TrainingJobs whose workers really train, on Nodes run by the test kubelet.

The operator (as the chart's ServiceAccount) creates the gang behind its
scheduling gate, places it on the kubelet's two nodes, and injects the
runtime (spec.runtime): an init container copies it into the pod, the
launcher starts torchrun from the PET_* variables, and two processes per
worker train examples/train/regression_ddp.py with DDP over gloo on
127.0.0.0/8. Nothing here is simulated but the GPUs.
"""

from __future__ import annotations

import json
import os
import signal
import warnings
from pathlib import Path
from typing import Any

import pytest

from cluster.controlplane import Cluster
from cluster.deploy import OperatorProcess
from e2e.kubelet import TestKubelet
from e2e.podrun import PodRun, sandbox_unavailable
from integration.trainwave_fixtures import (
    apply,
    job,
    job_manifest,
    wait_for_phase,
    wait_until,
    worker_pods,
)
from trainwave import contract

UNAVAILABLE = sandbox_unavailable()
pytestmark = pytest.mark.skipif(UNAVAILABLE is not None, reason=f"skipped: {UNAVAILABLE}")

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "examples" / "train" / "regression_ddp.py"
CHECKPOINTS = "/checkpoints"  # where the workers see the shared hostPath


def training_job(
    name: str,
    kubelet: TestKubelet,
    checkpoints: Path,
    *,
    steps: int,
    every: int,
    step_seconds: float = 0.0,
) -> dict[str, Any]:
    """2 workers x 2 processes with the runtime injected.

    Each worker asks for a whole node's 8 GPUs, so the placer pins one worker to each
    of the kubelet's nodes (with fewer, best fit would pack both onto one node).
    """
    worker = {
        "name": contract.WORKER_CONTAINER,
        "volumeMounts": [{"name": "checkpoints", "mountPath": CHECKPOINTS}],
        # Pods share this machine's network: each launcher serves /status on its own pod IP.
        "env": [
            {"name": contract.ENV_STATUS_HOST, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
        ],
    }  # fmt: skip
    return job_manifest(
        name,
        workers=2,
        gpus=8,
        result=None,
        processesPerWorker=2,
        command=["python", str(SCRIPT)],
        args=["--step-seconds", str(step_seconds)],
        env=[{"name": contract.ENV_TELEMETRY_INTERVAL_SECONDS, "value": "1"}],
        runtime={
            "checkpoint": {"path": CHECKPOINTS, "everySteps": every, "keep": 3},
            "totalSteps": steps,
        },
        template_spec={
            "nodeSelector": kubelet.selector,
            "containers": [worker],
            "volumes": [
                {
                    "name": "checkpoints",
                    "hostPath": {"path": str(checkpoints), "type": "DirectoryOrCreate"},
                }
            ],
        },
    )


def events(run: PodRun, kind: str) -> list[dict[str, Any]]:
    """The training script's JSON lines of one kind, from a pod's worker log."""
    found = []
    for line in run.log_path(contract.WORKER_CONTAINER).read_text().splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            if record.get("event") == kind and "logger" not in record:
                found.append(record)
    return found


def launcher_settings(run: PodRun) -> dict[str, Any]:
    for line in run.log_path(contract.WORKER_CONTAINER).read_text().splitlines():
        if '"trainwave.launch"' in line and '"settings"' in line:
            record: dict[str, Any] = json.loads(line)
            return record
    raise AssertionError(f"no launcher settings line in {run.name}'s log")


def rank0(kubelet: TestKubelet, namespace: str, name: str, attempt: int) -> PodRun:
    return kubelet.run_of(namespace, f"{name}-a{attempt}-worker-0")


def checkpoint_steps(directory: Path) -> list[int]:
    return sorted(int(p.stem.removeprefix("step-")) for p in directory.glob("step-*.pt"))


@pytest.mark.timeout(300)
def test_gang_trains_with_ddp_and_succeeds(
    trainwave_installed: Cluster,
    running_operator: OperatorProcess,
    test_kubelet: TestKubelet,
    namespace: str,
    tmp_path: Path,
) -> None:
    steps = 40
    apply(
        trainwave_installed,
        namespace,
        training_job("ddp", test_kubelet, tmp_path, steps=steps, every=20),
    )

    done = wait_for_phase(
        trainwave_installed, namespace, "ddp", ("Succeeded", "Failed"), timeout=200
    )

    assert done["status"]["phase"] == "Succeeded", done["status"]
    # The gang that finished; a restarted one keeps its failed attempt's pods for their logs
    # (gloo has aborted a rank now and then on this loaded machine: a restart, then success).
    attempt = str(done["status"]["attempt"])
    pods = [p for p in worker_pods(trainwave_installed, namespace, "ddp")
            if p["metadata"]["labels"][contract.LABEL_ATTEMPT] == attempt]  # fmt: skip
    assert sorted(p["spec"]["nodeName"] for p in pods) == sorted(test_kubelet.node_names)
    assert {p["status"]["phase"] for p in pods} == {"Succeeded"}
    first_run = rank0(test_kubelet, namespace, "ddp", attempt=0)
    # The operator creates the Service once every worker has an address, so the gang started
    # before its peers' names resolved; the rendezvous waited for them.
    assert first_run.started_at is not None
    assert first_run.peers_named_at is not None
    assert first_run.started_at < first_run.peers_named_at
    run = rank0(test_kubelet, namespace, "ddp", attempt=int(attempt))
    installed = run.log_path(contract.RUNTIME_INIT_CONTAINER).read_text()
    assert "trainwave runtime installed in /opt/trainwave/trainwave" in installed
    settings = launcher_settings(run)
    assert settings["settings"]["checkpoint"]["dir"] == CHECKPOINTS
    assert settings["command"][1:4] == ["-m", "torch.distributed.run", "--no-python"]
    (start,) = events(run, "start")
    assert start["world_size"] == 4
    done_steps = [e["step"] for e in events(run, "step")]
    if attempt == "0":
        assert start["resumed_from"] == 0
        assert done_steps == list(range(1, steps + 1))
    else:  # the restarted gang resumed from a checkpoint and finished the count
        warnings.warn(f"the DDP gang restarted: {done['status']['message']}", stacklevel=1)
        assert done_steps == list(range(start["resumed_from"] + 1, steps + 1))
    losses = [e["loss"] for e in events(first_run, "step")] + [
        e["loss"] for e in events(run, "step") if attempt != "0"
    ]
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < 0.5 * first, (
        f"loss did not go down enough: first 5 {first:.3f}, last 5 {last:.3f}"
    )
    assert checkpoint_steps(tmp_path) == [20, 40]


@pytest.mark.timeout(300)
def test_killed_worker_restarts_the_gang_from_the_latest_checkpoint(
    trainwave_installed: Cluster,
    running_operator: OperatorProcess,
    test_kubelet: TestKubelet,
    namespace: str,
    tmp_path: Path,
) -> None:
    steps, every = 120, 10
    manifest = training_job(
        "resume", test_kubelet, tmp_path, steps=steps, every=every, step_seconds=0.2
    )
    apply(trainwave_installed, namespace, manifest)
    wait_until(lambda: [s for s in checkpoint_steps(tmp_path) if s >= 2 * every], 200,
               "a second checkpoint of attempt 0")  # fmt: skip

    victim = training_process(test_kubelet.run_of(namespace, "resume-a0-worker-1"), rank=3)
    os.kill(victim, signal.SIGKILL)
    saved_before_restart = checkpoint_steps(tmp_path)[-1]

    first = rank0(test_kubelet, namespace, "resume", attempt=0)
    assert first.finished.wait(60), "attempt 0's worker 0 still runs a minute after the kill"
    last_of_attempt_0 = events(first, "step")[-1]["step"]

    # The operator reads each worker's /status (the launcher, on the pod IP) every 15 s and
    # shows rank 0's progress; a step attempt 0 never reached proves it is attempt 1's.
    def progress_of_attempt_1() -> dict[str, Any] | None:
        status = job(trainwave_installed, namespace, "resume").get("status", {})
        progress = status.get("progress") or {}
        step = progress.get("step") or 0
        return progress if status.get("attempt") == 1 and step > last_of_attempt_0 else None

    progress = wait_until(progress_of_attempt_1, 200, "status.progress of attempt 1")
    assert progress["totalSteps"] == steps
    assert progress["loss"] is not None

    done = wait_for_phase(
        trainwave_installed, namespace, "resume", ("Succeeded", "Failed"), timeout=240
    )
    assert done["status"]["phase"] == "Succeeded", done["status"]
    assert (done["status"]["attempt"], done["status"]["restarts"]) == (1, 1)
    second = rank0(test_kubelet, namespace, "resume", attempt=1)
    (restart,) = events(second, "start")
    resumed = restart["resumed_from"]
    assert resumed >= saved_before_restart, restart
    assert resumed % every == 0, restart
    continued = [e["step"] for e in events(second, "step")]
    assert continued == list(range(resumed + 1, steps + 1))
    # Restored, not restarted: the loss picks up where attempt 0 left it.
    before = {e["step"]: e["loss"] for e in events(first, "step")}
    after = events(second, "step")[0]["loss"]
    assert after < 0.5 * before[1], f"loss after resume {after} vs {before[1]} at step 1"
    assert checkpoint_steps(tmp_path)[-1] == steps


def training_process(run: PodRun, rank: int) -> int:
    """The host PID of the training process with global `rank` (a torchrun worker)."""

    def find() -> int | None:
        for process in run.processes():
            env = process.environ
            # Only torchrun's workers carry the restart count; its agent and the
            # launcher have the pod's RANK (the node's first rank) too.
            if "TORCHELASTIC_RESTART_COUNT" in env and env.get("RANK") == str(rank):
                return process.pid
        return None

    found: int = wait_until(find, 30, f"training process of rank {rank} in {run.name}")
    return found
