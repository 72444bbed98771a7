"""A worker deleted while the operator cannot watch is still noticed: its gang restarts.

The operator is stopped (SIGSTOP) while kube-apiserver restarts, and the worker is
deleted through the new API server before the operator runs again. Its watches then
resume from a resourceVersion the new server's watch cache never held: 410 Gone, and
only a relist shows the deletion. kopf's indexes, which reconciles read before, kept
the deleted pod after such a relist and the job waited on it forever.

The relist reports the worker as deleted (kube/informer.py's DeletedFinalStateUnknown, as
client-go's DeltaFIFO.Replace does), with the last state the operator saw: the job
says the worker "was deleted before it finished", not that it vanished.
"""

from __future__ import annotations

import os
import re
import signal
import urllib.request
from collections.abc import Iterator

import pytest

from cluster.controlplane import Cluster
from cluster.deploy import OperatorProcess
from cluster.restarts import restart_api_server
from integration.trainwave_fixtures import (
    apply,
    events_about,
    job,
    job_manifest,
    operator_restarted_with,
    wait_for_phase,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


@pytest.fixture
def patient_operator(running_operator: OperatorProcess) -> Iterator[OperatorProcess]:
    """The session operator restarted with a renew deadline longer than any gap here.

    With the default 10 s a leader stopped longer than that exits when it wakes, as it
    must (a standby may hold the Lease by then), and no new attempt comes: restarting
    the API server took longer than that on loaded cores (seen under pytest-xdist). The
    same pod name takes the Lease back at once, and the session operator is started
    again afterwards."""
    with operator_restarted_with(
        running_operator, "--leader-elect-lease-duration", "300",
        "--leader-elect-renew-deadline", "240",
    ) as patient:  # fmt: skip
        yield patient


def test_worker_deleted_during_a_watch_gap_restarts_the_gang(
    cluster: Cluster, namespace: str, patient_operator: OperatorProcess
) -> None:
    apply(cluster, namespace, job_manifest("gap", workers=2, result=None))
    wait_for_phase(cluster, namespace, "gap", "Running", timeout=90)
    relists_before = worker_pod_relists(patient_operator)
    assert patient_operator.process is not None
    group = patient_operator.process.pid
    os.killpg(group, signal.SIGSTOP)
    try:
        restart_api_server(cluster.state_dir)
        cluster.kubectl("delete", "pod", "gap-a0-worker-1", "-n", namespace,
                        "--grace-period=0", "--force", "--wait=true", timeout=60)  # fmt: skip
    finally:
        os.killpg(group, signal.SIGCONT)

    def restarted() -> dict[str, object] | None:
        status = job(cluster, namespace, "gap").get("status", {})
        return status if status.get("attempt", 0) >= 1 else None

    wait_until(restarted, 90, "a new attempt after the worker lost in the gap")
    assert worker_pod_relists(patient_operator) > relists_before, "seen by a relist"
    # Reported as a deletion carrying the worker's last state (rank, name), not as a
    # worker missing for no known reason ("vanished before it finished").
    deleted = "worker 1 (gap-a0-worker-1) was deleted before it finished"
    events_about(
        cluster, namespace,
        lambda e: e["regarding"].get("name") == "gap" and deleted in (e.get("note") or ""),
        f"an Event saying {deleted!r}",
    )  # fmt: skip
    wait_for_phase(cluster, namespace, "gap", "Running", timeout=90)
    assert patient_operator.alive()


def worker_pod_relists(operator: OperatorProcess) -> int:
    """trainwave_cache_relists_total{kind="worker-pods"} from the operator's metrics."""
    url = f"http://127.0.0.1:{operator.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    found = re.search(r'^trainwave_cache_relists_total\{kind="worker-pods"\} (\S+)$', text, re.M)
    assert found, "the operator exports its worker-pod relists"
    return int(float(found.group(1)))
