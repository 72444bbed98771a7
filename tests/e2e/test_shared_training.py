"""End to end: two jobs share one simulated GPU, each held to half its memory by the allocator.

One test-kubelet node offers one shared GPU of 5 MiB. There is no GPU on this
machine: the "device" is the runtime's CPU-simulated device tier, so every
peak here is model-based. The node-local arbiter runs as a process, as the
agent DaemonSet's arbiter container would, serving the socket directory the
agent fills (the agent's own code writes gpus.json); the operator is started
with --arbiter-dir, as the chart starts it. Each job's model needs about
3.7 MB to train plainly and gets a 2 MiB budget: prepare() measures that and
trains through the submodel executor. A third job would overfill the GPU and
waits, saying which GPU is fullest.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cluster.controlplane import Cluster
from cluster.deploy import OperatorProcess
from cluster.topology import NodeShape
from e2e.kubelet import TestKubelet
from e2e.podrun import PodRun, sandbox_unavailable
from integration.trainwave_fixtures import (
    apply,
    condition,
    job,
    job_manifest,
    wait_for_phase,
    wait_until,
    worker_pods,
)
from trainwave import contract
from trainwave.agent.running import write_arbiter_gpus
from trainwave.hardware.inventory import GpuInfo
from trainwave.runtime.submodel.arbiter import ArbiterClient

UNAVAILABLE = sandbox_unavailable()
pytestmark = pytest.mark.skipif(UNAVAILABLE is not None, reason=f"skipped: {UNAVAILABLE}")

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "examples" / "train" / "budgeted_mlp.py"
GPU_MIB = 5
BUDGET = 2 << 20  # 2Mi: about half of what the model needs to train plainly
SHARED_SHAPE = NodeShape.model_validate(
    {"cpu": "16", "gpu": {"product": "Simulated-CPU-Device", "count": 1, "memoryMiB": GPU_MIB,
                          "shared": True}}
)  # fmt: skip


@pytest.fixture(scope="module")
def shared_kubelet(
    cluster: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TestKubelet]:
    kubelet = TestKubelet(
        cluster.kubeconfig,
        tmp_path_factory.mktemp("shared-kubelet"),
        venv=Path(sys.prefix),
        nodes=1,
        image_env={"PYTHONPATH": str(REPO / "operator"), "OMP_NUM_THREADS": "1"},
        shape=SHARED_SHAPE,
    )
    try:
        kubelet.start()
        cluster.kubectl("wait", "--for=condition=Ready", f"node/{kubelet.node_names[0]}",
                        "--timeout=30s")  # fmt: skip
        yield kubelet
    finally:
        kubelet.stop()


@pytest.fixture(scope="module")
def shared_gpu(cluster: Cluster, shared_kubelet: TestKubelet) -> str:
    node = json.loads(
        cluster.kubectl("get", "node", shared_kubelet.node_names[0], "-o", "json").stdout
    )
    inventory = json.loads(node["metadata"]["annotations"][contract.ANNOTATION_INVENTORY])
    (gpu,) = inventory["sharedGpus"]
    return str(gpu["uuid"])


@pytest.fixture(scope="module")
def arbiter(tmp_path_factory: pytest.TempPathFactory, shared_gpu: str) -> Iterator[Path]:
    """The arbiter container's work, on this machine: sockets in a host directory."""
    directory = tmp_path_factory.mktemp("arbiter")
    write_arbiter_gpus(directory, [GpuInfo(0, shared_gpu, "sim", GPU_MIB, "0000:01:00.0", None)])
    server = subprocess.Popen(
        [sys.executable, "-m", "trainwave.runtime.submodel.arbiter", "--directory", str(directory)],
        env={"PYTHONPATH": str(REPO / "operator")},
        stderr=(directory / "arbiter.log").open("wb"),
    )
    try:
        wait_until((directory / f"{shared_gpu}.sock").exists, 20, "the arbiter socket")
        yield directory
    finally:
        server.kill()
        server.wait()


@pytest.fixture
def operator_with_arbiter(running_operator: OperatorProcess, arbiter: Path) -> Iterator[Path]:
    """The session operator, restarted with --arbiter-dir as the chart passes it; yields
    the arbiter's directory."""
    before = running_operator.extra_args
    running_operator.stop()
    running_operator.extra_args = (*before, "--arbiter-dir", str(arbiter))
    running_operator.start()
    try:
        yield arbiter
    finally:
        running_operator.stop()
        running_operator.extra_args = before
        running_operator.start()


def shared_job(name: str, kubelet: TestKubelet, *, steps: int) -> dict[str, Any]:
    worker = {
        "name": contract.WORKER_CONTAINER,
        "env": [
            {"name": contract.ENV_STATUS_HOST, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
        ],
    }  # fmt: skip
    return job_manifest(
        name,
        workers=1,
        gpus=0,
        result=None,
        command=["python", str(SCRIPT)],
        args=["--step-seconds", "0.3"],
        runtime={"totalSteps": steps},  # features.submodel: auto, the default
        gpuSharing={"memory": "2Mi"},
        template_spec={"nodeSelector": kubelet.selector, "containers": [worker]},
    )


def events(run: PodRun, kind: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    log = run.log_path(contract.WORKER_CONTAINER)
    if not log.exists():  # the runtime's init container still runs
        return found
    for line in log.read_text().splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            if record.get("event") == kind:
                found.append(record)
    return found


def training_process(run: PodRun) -> Any:
    def find() -> Any:
        return next((p for p in run.processes() if str(SCRIPT) in p.argv), None)

    return wait_until(find, 60, f"the training process of {run.name}")


def held_to_budget(run: PodRun) -> dict[str, Any]:
    """The run went through the allocator and every measured peak stayed in the budget."""
    (start,) = events(run, "start")
    assert start["report"]["submodel"].startswith(
        f"on: the measured peak {start['plain_peak']} B exceeds the budget {BUDGET} B"
    ), start["report"]
    assert start["report"]["arbiter"].startswith("on: turns from"), start["report"]
    assert start["plain_peak"] > BUDGET
    (done,) = events(run, "done")
    peaks = done["peaks"]
    assert 0 < peaks["ledger"] <= BUDGET, peaks
    assert 0 < peaks["census"] <= BUDGET, peaks
    return peaks


@pytest.mark.timeout(420)
def test_two_jobs_share_one_gpu_within_their_budgets_and_survive_a_neighbour_kill(
    trainwave_installed: Cluster,
    operator_with_arbiter: Path,
    shared_kubelet: TestKubelet,
    shared_gpu: str,
    namespace: str,
) -> None:
    cluster, steps, arbiter = trainwave_installed, 40, operator_with_arbiter
    apply(cluster, namespace, shared_job("a", shared_kubelet, steps=steps),
          shared_job("b", shared_kubelet, steps=steps))  # fmt: skip
    runs: dict[str, PodRun] = {}
    for name in ("a", "b"):
        prefix = f"{name}-a0-"
        runs[name] = wait_until(
            lambda prefix=prefix: next(iter(shared_kubelet.pod_runs(namespace, prefix)), None),
            90,
            f"job {name}'s worker to run",
        )
    wait_until(lambda: all(len(events(r, "step")) >= 3 for r in runs.values()), 120,
               "both jobs training")  # fmt: skip

    # Pinned in the pod itself: the kubelet resolved the env from the placement.
    socket = f"{arbiter}/{shared_gpu}.sock"
    for name, run in runs.items():
        [pod] = worker_pods(cluster, namespace, name)
        assert pod["metadata"]["annotations"][contract.ANNOTATION_GPU_UUID] == shared_gpu
        env = training_process(run).environ
        assert env["NVIDIA_VISIBLE_DEVICES"] == env["CUDA_VISIBLE_DEVICES"] == shared_gpu
        assert env[contract.ENV_ARBITER_SOCKET] == socket
        assert env[contract.ENV_GPU_MEMORY_BUDGET] == str(BUDGET)

    # A third would overfill the GPU (2 + 2 + 2 MiB > 5 MiB): it waits, naming the GPU.
    apply(cluster, namespace, shared_job("c", shared_kubelet, steps=steps))
    waiting = wait_until(
        lambda: (c := condition(job(cluster, namespace, "c"), "Scheduled"))
        and c["reason"] == "NotEnoughGPUMemory" and c,
        60, "the third job to wait for GPU memory",
    )  # fmt: skip
    assert f"(GPU {shared_gpu} on node {shared_kubelet.node_names[0]})" in waiting["message"]
    cluster.kubectl("delete", "tj", "c", "-n", namespace, "--wait=false")

    victim = training_process(runs["a"])
    os.kill(victim.pid, signal.SIGKILL)
    observer = ArbiterClient(socket, job="observer")
    time.sleep(1)
    holders = observer.status()["holders"]
    assert not [h for h in holders if h.startswith(f"{namespace}/a/")], holders
    observer.close()

    done_b = wait_for_phase(cluster, namespace, "b", ("Succeeded", "Failed"), timeout=240)
    assert done_b["status"]["phase"] == "Succeeded", done_b["status"]
    assert [e["step"] for e in events(runs["b"], "step")] == list(range(1, steps + 1))
    assert done_b["status"]["restarts"] == 0, "the neighbour's kill did not touch b"
    peaks_b = held_to_budget(runs["b"])

    # The killed job restarts its gang (a worker failure) and finishes on the same GPU.
    done_a = wait_for_phase(cluster, namespace, "a", ("Succeeded", "Failed"), timeout=240)
    assert done_a["status"]["phase"] == "Succeeded", done_a["status"]
    assert done_a["status"]["restarts"] == 1
    peaks_a = held_to_budget(shared_kubelet.run_of(namespace, "a-a1-worker-0"))
    losses = [e["loss"] for e in events(runs["b"], "step")]
    assert losses[-1] < losses[0], losses
    print(json.dumps({"budget": BUDGET, "a": peaks_a, "b": peaks_b}))  # the figures, for the log
