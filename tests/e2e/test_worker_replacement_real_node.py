"""End to end: one worker replaced, not the gang (runPolicy.workerReplacement), on the real node.

The job of test_inplace_restart.py (2 workers x 2 processes, DDP over gloo, checkpoints on a
hostPath, the runtime's in-place restarts on). After the second checkpoint worker 1's pod is
deleted while the operator is paused, so it first sees the pod already ended by the deletion
(Failed, exit 143), as a busy operator may. The operator must still take it as a deletion
and create a new worker 1 (same attempt and rank, a new UID) while worker 0 keeps its pod:
worker 0's elastic agent sees its peer fail, restarts its processes into a new rendezvous
round and waits there; the new pod's launcher joins, every process resumes from the newest
checkpoint and the job Succeeds. The new pod comes back to the same node here; a drained
node's worker moving to another real node is tests/e2e/realnode/test_drain_nodes.py, the
choice of rack on kwok nodes tests/integration/test_worker_replacement_api.py.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from e2e.conftest import OPERATOR_PODS, Release
from e2e.test_inplace_restart import (
    EVERY,
    first_step_after,
    launcher_events,
    start_and_wait_for_checkpoint,
    timestamped_log,
)
from e2e.test_training import checkpoint_steps, events, training_job
from integration.trainwave_fixtures import wait_for_phase, wait_until, worker_pods

STEPS = 160


@pytest.mark.timeout(900)
def test_a_deleted_worker_is_replaced_alone_and_training_resumes(
    release: Release, namespace: str, tmp_path: Path
) -> None:
    name = "replace1"
    manifest = training_job(name, tmp_path, steps=STEPS, every=EVERY, step_seconds=0.2)
    uids = start_and_wait_for_checkpoint(release, namespace, name, manifest, tmp_path)
    saved = checkpoint_steps(tmp_path)[-1]
    victim = f"{name}-a0-worker-1"
    fault = time.time()
    # The operator sees the deletion only once the kubelet has ended the pod (Failed, or
    # gone): the order a busy operator sees it in. A pod that failed because it was
    # deleted was still taken, and is replaced alone.
    with operators_paused(release):
        release.cluster.kubectl("delete", "pod", victim, "-n", namespace, "--wait=false")
        wait_until(lambda: pod_ended(release, namespace, victim), 120,
                   f"the kubelet ended {victim}")  # fmt: skip
    print(f"operators paused {time.time() - fault:.1f} s, until the kubelet ended {victim}")

    done = wait_for_phase(release.cluster, namespace, name, ("Succeeded", "Failed"), timeout=600)
    status = done["status"]
    if status["phase"] != "Succeeded" or status["attempt"] != 0:
        for pod in sorted(
            p["metadata"]["name"] for p in worker_pods(release.cluster, namespace, name)
        ):
            lines = timestamped_log(release, namespace, pod)
            print(f"--- {pod}\n" + "\n".join(t for _, t in lines[-60:]))
        print_why(release, namespace, name, status)
    assert status["phase"] == "Succeeded", status
    assert status["attempt"] == 0, status  # no new attempt: the gang was not recreated
    assert (status["restarts"], status["disruptions"]) == (0, 1), status
    assert status["replacements"]["total"] == 1, status["replacements"]
    said = release.cluster.kubectl(
        "get", "events", "-n", namespace, "--field-selector", "reason=ReplacingWorker",
        "-o", "jsonpath={.items[*].message}",
    ).stdout  # fmt: skip
    assert f"worker 1 ({victim}) was deleted before it finished" in said, said
    after = {p["metadata"]["name"]: p["metadata"]["uid"]
             for p in worker_pods(release.cluster, namespace, name)}  # fmt: skip
    assert after[f"{name}-a0-worker-0"] == uids[f"{name}-a0-worker-0"], "worker 0 was recreated"
    assert f"{victim}-r1" in after, f"worker 1 was not replaced: {sorted(after)}"

    log = timestamped_log(release, namespace, f"{name}-a0-worker-0")
    text = "\n".join(t for _, t in log)
    starts = events(text, "start")
    assert len(starts) == 2, starts  # one per generation, in worker 0's same container
    assert starts[1]["resumed_from"] >= saved, (starts[1], saved)
    finished = events(text, "done")
    assert finished, "rank 0 logged no done"
    assert int(finished[-1]["steps"]) == STEPS
    first_at, first_step = first_step_after(log, fault)
    print(f"replaced alone: delete -> first new step {first_step} in {first_at - fault:.1f} s "
          f"(resumed from {starts[1]['resumed_from']}, checkpoint {saved})")  # fmt: skip
    restarts = launcher_events(log, "restart")
    print(f"worker 0's launcher: {[(r['count'], r['cause']) for r in restarts]}")
    assert restarts, "worker 0's processes did not restart in place"


def print_why(release: Release, namespace: str, name: str, status: dict[str, Any]) -> None:
    """What the operator decided and why: the job's conditions, the namespace's Events and
    the operator's log lines about the job (a recreated gang says why in them)."""
    for condition in status.get("conditions", []):
        print(f"condition {condition['type']}={condition['status']} {condition.get('reason')}: "
              f"{condition.get('message')}")  # fmt: skip
    print(release.cluster.kubectl(
        "get", "events", "-n", namespace, "--sort-by=.lastTimestamp",
        "-o", "custom-columns=AT:.lastTimestamp,TYPE:.type,REASON:.reason,OBJ:.involvedObject.name,MSG:.message",
    ).stdout)  # fmt: skip
    log = release.cluster.kubectl(
        "logs", "-n", release.namespace, "-l", OPERATOR_PODS, "--tail=-1", "--prefix", check=False
    ).stdout  # fmt: skip
    print("\n".join(line for line in log.splitlines() if name in line)[-20000:])


@contextmanager
def operators_paused(release: Release) -> Iterator[None]:
    """Every operator container stopped (SIGSTOP from the host: a container's PID 1 ignores
    what is sent from inside its PID namespace) and continued on exit, well within the
    Lease (15 s), so the leader stays the leader."""
    pids = [
        int(release.container_info(release.namespace, pod["metadata"]["name"], "operator")["pid"])
        for pod in release.operator_pods()
    ]
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)


def pod_ended(release: Release, namespace: str, pod: str) -> bool:
    """The pod finished (its kubelet stopped the container) or is gone from the API."""
    found = release.cluster.kubectl("get", "pod", pod, "-n", namespace, "-o", "json", check=False)
    if found.returncode != 0:
        return "NotFound" in found.stderr
    phase: Any = json.loads(found.stdout).get("status", {}).get("phase")
    return phase in ("Succeeded", "Failed")
