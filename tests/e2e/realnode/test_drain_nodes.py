"""`kubectl drain` of a worker's node, on real nodes: the worker moves to another node and the
gang trains on, not recreated (runPolicy.workerReplacement, issue 26 item 2).

The job of test_inplace_restart.py (2 workers x 2 processes, DDP over gloo, checkpoints on a
hostPath, in-place restarts on) asks 5 GPUs per worker on the three real nodes, so each
worker takes a node (a real node has 6 whole GPUs) and one node stays free. After the second
checkpoint, one worker's node is drained as an administrator does, restricted to this job's
pods (`kubectl drain --pod-selector`, so the chart's own pods stay): cordoned, then the
worker's pod evicted. The operator must create a new pod for that worker in the same attempt
on the free node (the cordoned one cannot take it, the other worker's has no room), while the
other worker keeps its pod; the job resumes from the newest checkpoint and Succeeds. Twice:
- worker 1 drained: worker 0's agent sees a node waiting and re-enters rendezvous;
- worker 0 drained: it hosted the rendezvous store, so worker 1's agent ends with it, and
  worker 1's launcher starts it again to meet the new worker 0's store
  (runtime/launcher/rejoin.py); its pod stays.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from e2e.conftest import Release
from e2e.test_inplace_restart import EVERY, start_and_wait_for_checkpoint
from e2e.test_training import training_job
from integration.conftest import namespace_name
from integration.trainwave_fixtures import wait_for_phase, worker_pods
from trainwave import contract

pytestmark = pytest.mark.timeout(900)

STEPS = 160
GPUS_PER_WORKER = 5  # of a real node's 6 whole GPUs: one worker per node


def nodes_by_worker(release: Release, namespace: str, name: str) -> dict[int, tuple[str, str]]:
    """Worker index -> (pod uid, node) of the running pods."""
    return {
        int(p["metadata"]["labels"][contract.LABEL_RANK]): (p["metadata"]["uid"],
                                                            p["spec"].get("nodeName", ""))
        for p in worker_pods(release.cluster, namespace, name)
        if p["metadata"].get("deletionTimestamp") is None
    }  # fmt: skip


def launcher_events(
    release: Release, namespace: str, name: str, rank: int
) -> list[dict[str, object]]:
    """The launcher's log events of the running pod of worker `rank`."""
    (pod,) = (
        p["metadata"]["name"]
        for p in worker_pods(release.cluster, namespace, name)
        if int(p["metadata"]["labels"][contract.LABEL_RANK]) == rank
        and p["metadata"].get("deletionTimestamp") is None
    )
    logs = release.cluster.kubectl(
        "logs", "-n", namespace, pod, "-c", contract.WORKER_CONTAINER, check=False
    ).stdout
    lines = (json.loads(line) for line in logs.splitlines() if line.startswith('{"ts"'))
    return [line for line in lines if line.get("logger") == "trainwave.launch"]


def kept_workers_rejoin(
    release: Release, namespace: str, name: str, kept: int, timeout: float
) -> dict[str, object]:
    """The kept worker's `store-reachable` event, once written; with the new worker 0's
    events in the message when it did not come by the announced address."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [e for e in launcher_events(release, namespace, name, kept)
                 if e.get("event") == "store-reachable"]  # fmt: skip
        if found:
            if found[0].get("via") != "announced address":
                events = launcher_events(release, namespace, name, 1 - kept)
                raise AssertionError(f"kept worker: {found[0]}; new worker 0: {events}")
            return found[0]
        time.sleep(2)
    raise AssertionError(f"no store-reachable event from worker {kept} in {timeout} s")


@pytest.mark.parametrize("moved", [1, 0], ids=["worker-1", "worker-0"])
def test_a_drained_nodes_worker_moves_to_another_node_and_the_gang_trains_on(
    three_node_release: Release, tmp_path: Path, moved: int
) -> None:
    release, name, kept = three_node_release, f"drain-w{moved}", 1 - moved
    cluster = release.cluster
    namespace = namespace_name(f"drain-nodes-w{moved}")
    cluster.kubectl("create", "namespace", namespace)
    cluster.kubectl(
        "wait", "--for=create", "serviceaccount/default", "-n", namespace, "--timeout=30s"
    )
    manifest = training_job(name, tmp_path, steps=STEPS, every=EVERY, step_seconds=0.2)
    manifest["spec"]["gpusPerWorker"] = GPUS_PER_WORKER
    start_and_wait_for_checkpoint(release, namespace, name, manifest, tmp_path)
    before = nodes_by_worker(release, namespace, name)
    assert before[0][1] != before[1][1], before
    drained = before[moved][1]
    try:
        cluster.kubectl(
            "drain", drained, "--ignore-daemonsets", "--delete-emptydir-data",
            f"--pod-selector={contract.LABEL_JOB_NAME}={name}", "--timeout=120s", timeout=130,
        )  # fmt: skip
        if moved == 0:  # before the job ends and its pods' logs may go with them
            rejoined = kept_workers_rejoin(release, namespace, name, kept, timeout=300)
            # The new worker 0 told the kept worker its address (launcher/announce.py): no
            # lookup of its name, which DNS caches could answer with the drained pod's.
            assert rejoined["via"] == "announced address", rejoined
            print(f"worker {kept} rejoined by the announced address: {rejoined}")
        done = wait_for_phase(cluster, namespace, name, ("Succeeded", "Failed"), timeout=600)
    finally:
        cluster.kubectl("uncordon", drained, check=False)
    status = done["status"]
    assert status["phase"] == "Succeeded", status
    assert status["attempt"] == 0, status  # no new attempt: the gang was not recreated
    assert status["disruptions"] == 1, status
    assert status["replacements"]["total"] == 1, status["replacements"]
    after = nodes_by_worker(release, namespace, name)
    assert after[kept] == before[kept], f"worker {kept} was recreated or moved"
    assert after[moved][0] != before[moved][0], f"worker {moved} was not replaced"
    assert after[moved][1] not in (drained, before[kept][1]), (drained, before, after)
    print(
        f"drained {drained}: worker {moved} moved to {after[moved][1]}, "
        f"worker {kept} stayed on {after[kept][1]}"
    )
    cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
