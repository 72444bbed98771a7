"""Hung, Straggler and status.goodput from signed runtime reports, on the real control plane.

As in test_status_trust.py, the worker runs with hostNetwork on a kwok node (its pod
IP is 127.0.0.1) and the test serves its /status itself with the runtime's own
StatusServer and signer, keyed with the Secret the operator made for the job. The
document follows the launcher's contract (ranks, restarts, in_place): one worker with
two ranks, rank 1 twice as slow in compute time per step. The test advances the steps,
freezes them (a hang: the operator's clock runs, no step moves), then lets them move
again, and reads what the operator made of it: conditions, Events, status.goodput and
the metrics the dashboard's goodput panels query.
"""

from __future__ import annotations

import base64
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from cluster.deploy import free_port
from integration.test_dashboard_metrics import RUNTIME_ONLY, rendered
from integration.trainwave_fixtures import (
    STATUS_INTERVAL_SECONDS,
    apply,
    env_of,
    events_about,
    get_json,
    job,
    job_manifest,
    wait_for_phase,
    wait_until,
    worker_pods,
)
from trainwave import contract
from trainwave.runtime.launch import status_signer
from trainwave.runtime.launcher.status import StatusServer
from trainwave.runtime.settings import load_settings
from unit.promql import chart_queries, problems

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

# The session operator polls every STATUS_INTERVAL_SECONDS (2 s): the Hung condition comes
# within a poll of the timeout, and a resumed step is seen long before a second timeout.
HANG_TIMEOUT = 15


class Training:
    """The launcher's /status of one worker with ranks 0 and 1; steps advance one per read
    while `moving`, each read a fresh report (its time moves) as a real launcher's would."""

    def __init__(self, namespace: str, name: str) -> None:
        self.identity = {"namespace": namespace, "job": name, "attempt": 0, "node_rank": 0}
        self.step = 100
        self.moving = True
        self.lock = threading.Lock()

    def document(self) -> dict[str, Any]:
        with self.lock:
            if self.moving:
                self.step += 1
            step, now = self.step, 1_764_180_000.0 + self.step
        ranks = {
            str(rank): {"step": step, "time": now, "step_seconds": 0.5,
                        "compute_seconds": compute, "generation": 1,
                        # The runtime's last reports (one a telemetry interval): the
                        # operator judges stragglers on these, at its first poll.
                        "compute_history": [compute] * 3,
                        "state": "running" if self.moving else "stopped" if rank else "running"}
            for rank, compute in ((0, 0.1), (1, 0.2))
        }  # fmt: skip
        return {
            **self.identity,
            "progress": {"step": step},
            "ranks": ranks,
            "restarts": {"count": 1, "causes": {"failure": 1, "hang": 0, "peer": 0},
                         "last": {"cause": "failure", "at": 50.0, "step_before": 90,
                                  "resumed_from": 80, "first_step_at": 56.5}},
            "in_place": {"enabled": True, "max_restarts": 3,
                         "hang_timeout_seconds": HANG_TIMEOUT, "reason": ""},
        }  # fmt: skip


def condition(cluster: Any, namespace: str, name: str, kind: str) -> dict[str, Any] | None:
    conditions = job(cluster, namespace, name).get("status", {}).get("conditions", [])
    return next((c for c in conditions if c["type"] == kind), None)


def counter(operator: Any, name: str) -> float:
    found = re.search(rf"^{name} (\S+)$", operator.metrics(), re.M)
    return float(found.group(1)) if found else 0.0


def start_job(cluster: Any, namespace: str, name: str, port: int, tmp_path: Path, *,
              run_policy: dict[str, Any], in_place: int = 3) -> tuple[dict[str, Any], Any]:  # fmt: skip
    """The job Running with one hostNetwork worker; (its pod, the signer its launcher
    would sign its /status with)."""
    manifest = job_manifest(
        name,
        gpus=2,
        run_for="600s",
        processesPerWorker=2,
        masterPort=free_port(),
        runtime={"statusPort": port, "inPlaceRestarts": in_place},
        run_policy=run_policy,
        template_spec={"hostNetwork": True},
    )
    apply(cluster, namespace, manifest)
    wait_for_phase(cluster, namespace, name, "Running", timeout=90)
    [pod] = worker_pods(cluster, namespace, name)
    assert pod["status"]["podIP"] == "127.0.0.1"
    uid = job(cluster, namespace, name)["metadata"]["uid"]
    secret = get_json(cluster, namespace, "secret", f"{name}-status-key-{uid[:8]}")
    key_file = tmp_path / f"{name}.key"
    key_file.write_text(base64.b64decode(secret["data"][contract.STATUS_KEY_FILE]).decode())
    settings = load_settings({**env_of(pod), contract.ENV_STATUS_KEY_FILE: str(key_file)})
    return pod, status_signer(settings)


def test_hung_straggler_and_goodput_from_the_runtimes_reports(
    cluster, namespace, running_operator, tmp_path: Path
):
    name, port = "goodput", free_port()
    hangs_before = counter(running_operator, "trainwave_hangs_total")
    run_policy = {"hangTimeoutSeconds": HANG_TIMEOUT, "stragglers": {"reports": 2}}
    pod, signer = start_job(cluster, namespace, name, port, tmp_path, run_policy=run_policy)
    training = Training(namespace, name)

    with _serving(port, training, signer):
        # Moving: status.goodput fills, and rank 1 (2x the compute time in each of its
        # last reports) is named at the first poll.
        straggler = wait_until(
            lambda: (c := condition(cluster, namespace, name, "Straggler")) and
            c["status"] == "True" and c,
            90, "the Straggler condition",
        )  # fmt: skip
        assert straggler["message"].startswith(
            f"rank 1 (pod {pod['metadata']['name']}, node {pod['spec']['nodeName']}) is 2.0x "
            "the gang's median compute time per step"
        )
        events_about(
            cluster, namespace,
            lambda e: e.get("reason") == "Straggler" and e["regarding"]["name"] == name,
            "the Straggler Event",
        )  # fmt: skip
        events_about(
            cluster, namespace,
            lambda e: e.get("reason") == "RestartedInPlace" and e["regarding"]["name"] == name
            and "(cause failure): 1 of 3 in-place restarts" in e.get("note", ""),
            "the RestartedInPlace Event",
        )  # fmt: skip
        goodput = job(cluster, namespace, name)["status"]["goodput"]
        assert goodput["highestStep"] > 100
        assert goodput["inPlaceRestarts"] == 1
        assert goodput["inPlaceRestartCauses"] == {"failure": 1}
        assert goodput["stepsLost"] == 10
        assert goodput["lastRecoverySeconds"] == 6.5
        assert 0 < goodput["ratio"] <= 1
        assert "1 in-place restart(s), 10 steps lost" in goodput["summary"]
        wide = cluster.kubectl("get", "tj", name, "-n", namespace, "-o", "wide").stdout
        assert "GOODPUT" in wide
        assert "1 in-place restart(s)" in wide

        # Frozen: no step moves for hangTimeoutSeconds -> Hung, naming the ranks.
        with training.lock:
            training.moving = False
            frozen_at = training.step
        started = time.monotonic()
        hung = wait_until(
            lambda: (c := condition(cluster, namespace, name, "Hung")) and
            c["status"] == "True" and c,
            HANG_TIMEOUT + 45, "the Hung condition",
        )  # fmt: skip
        detected_after = time.monotonic() - started
        # Moving again before a second timeout: the condition clears, the gang stays.
        # At once: the checks of what Hung posted below take kubectl calls.
        with training.lock:
            training.moving = True
        assert f"stalled ranks: 0 (step {frozen_at}), 1 (step {frozen_at})" in hung["message"]
        assert "stopped (SIGSTOP): rank 1" in hung["message"]
        # The last move may be a poll (and a read) old when the steps stop.
        assert detected_after >= HANG_TIMEOUT - (STATUS_INTERVAL_SECONDS + 1)
        events_about(
            cluster, namespace,
            lambda e: e.get("reason") == "Hung" and e["regarding"]["name"] == name,
            "the Hung Event",
        )  # fmt: skip
        assert counter(running_operator, "trainwave_hangs_total") >= hangs_before + 1
        cleared = wait_until(
            lambda: (c := condition(cluster, namespace, name, "Hung")) and
            c["status"] == "False" and c,
            30, "the Hung condition cleared",
        )  # fmt: skip
        assert cleared["reason"] == "ProgressResumed"
        body = job(cluster, namespace, name)
        assert body["status"]["attempt"] == 0
        assert body["status"]["restarts"] == 0

        _check_goodput_panel(running_operator.metrics(), namespace, name)


def _frozen_until_recreated(
    cluster: Any, namespace: str, name: str, tmp_path: Path, in_place: int = 3
) -> dict[str, Any]:
    """A job whose reported steps stop (hangTimeoutSeconds 10), until the gang is recreated:
    its status then."""
    port = free_port()
    policy = {"hangTimeoutSeconds": 10}
    _, signer = start_job(
        cluster, namespace, name, port, tmp_path, run_policy=policy, in_place=in_place
    )
    training = Training(namespace, name)
    with _serving(port, training, signer):
        wait_until(
            lambda: job(cluster, namespace, name)["status"].get("goodput"), 60, "status.goodput"
        )
        with training.lock:
            training.moving = False
        restarted: dict[str, Any] = wait_until(
            lambda: (s := job(cluster, namespace, name)["status"]).get("restarts") == 1 and s,
            90, "the gang recreated",
        )  # fmt: skip
    return restarted


def test_a_hang_the_launchers_do_not_repair_recreates_the_gang(
    cluster, namespace, running_operator, tmp_path: Path
):
    name = "stuck"
    # Hung after 10 s without a step, recreated 10 s later: counted as a restart, Hung.
    restarted = _frozen_until_recreated(cluster, namespace, name, tmp_path)
    assert restarted["attempt"] == 1
    hung = next(c for c in restarted["conditions"] if c["type"] == "Hung")
    assert hung["status"] == "False"
    assert hung["message"].startswith("gang recreated: no rank completed a step")
    events_about(
        cluster, namespace,
        lambda e: e.get("reason") == "Hung" and e.get("type") == "Warning"
        and "still hung 10s after it was found hung" in e.get("note", "")
        and "restarting the gang (restart 1 of" in e.get("note", ""),
        "the restart's Event",
    )  # fmt: skip
    assert re.search(
        r'^trainwave_gang_restarts_total\{cause="hang"\} [1-9]', running_operator.metrics(), re.M
    )
    # The hung gang's pod is deleted; the new gang's is created.
    wait_until(
        lambda: {p["metadata"]["labels"][contract.LABEL_ATTEMPT]
                 for p in worker_pods(cluster, namespace, name)
                 if not p["metadata"].get("deletionTimestamp")} == {"1"},
        60, "only attempt 1's worker left",
    )  # fmt: skip


def test_without_in_place_restarts_a_hang_recreates_the_gang_when_found(
    cluster, namespace, running_operator, tmp_path: Path
):
    # No launcher watchdog runs without in-place restarts, so the operator does not wait
    # a second timeout for one: the gang is recreated in the reconcile that finds it hung.
    name = "stuck-alone"
    restarted = _frozen_until_recreated(cluster, namespace, name, tmp_path, in_place=0)
    assert restarted["attempt"] == 1
    events_about(
        cluster, namespace,
        lambda e: e.get("reason") == "Hung" and e.get("type") == "Warning"
        and "launchers do not restart it in place (spec.runtime.inPlaceRestarts is 0)"
        in e.get("note", "") and "restarting the gang (restart 1 of" in e.get("note", ""),
        "the restart's Event",
    )  # fmt: skip
    notes = [e.get("note", "") for e in get_json(cluster, namespace, "events.events.k8s.io")["items"]
             if e["regarding"]["name"] == name]  # fmt: skip
    assert not any("still hung" in note for note in notes), notes


def _check_goodput_panel(text: str, namespace: str, name: str) -> None:
    """The goodput ratio is served per job, as the dashboard's panel reads it."""
    assert f'job_name="{name}",job_namespace="{namespace}"' in text
    queries = [(where, expr) for where, expr in chart_queries(rendered()) if RUNTIME_ONLY in expr]
    assert queries
    found = [f"{where}: {p}" for where, expr in queries for p in problems(expr, text)]
    assert not found, found


@contextmanager
def _serving(port: int, training: Training, signer: Any) -> Iterator[None]:
    server = StatusServer("127.0.0.1", port, training.document, signer).start()
    try:
        yield
    finally:
        server.stop()


def test_a_straggler_replaced_marks_its_node_and_the_new_gang_avoids_it(
    cluster, namespace, running_operator, tmp_path: Path
):
    name, port = "slow", free_port()
    policy = {"stragglers": {"reports": 2, "replace": True}}
    pod, signer = start_job(cluster, namespace, name, port, tmp_path, run_policy=policy)
    node = pod["spec"]["nodeName"]
    try:
        with _serving(port, Training(namespace, name), signer):
            restarted = wait_until(
                lambda: (s := job(cluster, namespace, name)["status"]).get("disruptions") == 1
                and s,
                90, "the gang recreated without the straggler's node",
            )  # fmt: skip
        assert restarted["attempt"] == 1
        assert restarted["restarts"] == 0  # a disruption: the user's maxRestarts is not spent
        replaced = next(c for c in restarted["conditions"] if c["type"] == "Straggler")
        assert replaced["reason"] == "StragglerReplaced"
        assert f"node {node} is marked trainwave.io/straggler-until=" in replaced["message"]
        annotations = get_json(cluster, "default", "node", node)["metadata"]["annotations"]
        assert contract.ANNOTATION_STRAGGLER_UNTIL in annotations
        taints = get_json(cluster, "default", "node", node)["spec"].get("taints") or []
        assert not [t for t in taints if t["key"].startswith("trainwave.io/")]  # never a taint
        wait_for_phase(cluster, namespace, name, "Running", timeout=90)
        [new] = [
            p for p in worker_pods(cluster, namespace, name)
            if p["metadata"]["labels"][contract.LABEL_ATTEMPT] == "1"
        ]  # fmt: skip
        assert new["spec"]["nodeName"] != node
    finally:
        cluster.kubectl("annotate", "node", node, f"{contract.ANNOTATION_STRAGGLER_UNTIL}-")
