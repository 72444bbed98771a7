"""runPolicy.preflight on the real control plane, from signed runtime reports.

As in test_goodput_channel.py, the worker runs with hostNetwork on a kwok node and the test
serves its /status with the runtime's own StatusServer and signer. The first gang's
launcher reports a bandwidth test whose ranks are below `minBusGbps`: the operator
must name the worker's node and ranks, mark the node, and re-place the gang on another
node as a disruption; the new gang's test passes and the condition turns True.
(One hostNetwork worker per job: two would share the status port on 127.0.0.1, so the
relative floor, which needs two workers, is covered by the unit tests.)
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from cluster.deploy import free_port
from integration.test_goodput_channel import condition, start_job
from integration.trainwave_fixtures import (
    env_of,
    events_about,
    get_json,
    job,
    wait_for_phase,
    wait_until,
    worker_pods,
)
from trainwave import contract
from trainwave.runtime.launch import status_signer
from trainwave.runtime.launcher.status import StatusServer
from trainwave.runtime.settings import load_settings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]


def after_test(namespace: str, name: str, attempt: int, gbps: float) -> dict[str, Any]:
    """The launcher's /status after its bandwidth test: ranks 0 and 1 at about `gbps`."""
    return {
        "namespace": namespace, "job": name, "attempt": attempt, "node_rank": 0,
        "preflight": {"attempt": attempt, "done": True, "seconds": 4.2, "error": None,
                      "size_mib": 64,
                      "ranks": {"0": {"bus_gbps": gbps}, "1": {"bus_gbps": gbps + 0.1}}},
    }  # fmt: skip


def preflight_metric(operator: Any, result: str) -> float:
    pattern = rf'^trainwave_preflight_tests_total\{{result="{result}"\}} (\S+)$'
    found = re.search(pattern, operator.metrics(), re.M)
    return float(found.group(1)) if found else 0.0


def test_a_node_below_the_floor_is_named_marked_and_the_gang_replaced_without_it(
    cluster, namespace, running_operator, tmp_path: Path
):
    name, port = "preflight", free_port()
    policy = {"preflight": {"enabled": True, "minBusGbps": 5, "sizeMiB": 16}}
    failed_before = preflight_metric(running_operator, "failed")
    passed_before = preflight_metric(running_operator, "passed")
    pod, signer = start_job(cluster, namespace, name, port, tmp_path, run_policy=policy)
    assert env_of(pod)[contract.ENV_PREFLIGHT_SIZE_MIB] == "16"
    node = pod["spec"]["nodeName"]
    try:
        document = after_test(namespace, name, 0, 1.2)
        server = StatusServer("127.0.0.1", port, lambda: document, signer).start()
        try:
            restarted = wait_until(
                lambda: (s := job(cluster, namespace, name)["status"]).get("disruptions") == 1
                and s,
                90, "the gang recreated without the slow node",
            )  # fmt: skip
        finally:
            server.stop()
        assert (restarted["attempt"], restarted["restarts"]) == (1, 0)
        found = next(c for c in restarted["conditions"] if c["type"] == "Preflight")
        assert (found["status"], found["reason"]) == ("False", "PreflightFailed")
        assert (
            f"worker 0 (pod {pod['metadata']['name']}, node {node}), rank 0: 1.25 Gbit/s, "
            "below 5 (minBusGbps 5)"
        ) in found["message"]
        assert f"node {node} marked trainwave.io/straggler-until=" in found["message"]
        assert restarted["preflight"]["failures"] == 1
        annotations = get_json(cluster, "default", "node", node)["metadata"]["annotations"]
        assert contract.ANNOTATION_STRAGGLER_UNTIL in annotations
        events = events_about(
            cluster, namespace, lambda e: e.get("reason") == "PreflightFailed", "the Event"
        )
        assert [e for e in events if f"node {node}" in e.get("note", "")]

        wait_for_phase(cluster, namespace, name, "Running", timeout=90)
        [new] = [
            p for p in worker_pods(cluster, namespace, name)
            if p["metadata"]["labels"][contract.LABEL_ATTEMPT] == "1"
        ]  # fmt: skip
        assert new["spec"]["nodeName"] != node
        key_file = tmp_path / f"{name}.key"
        settings = load_settings({**env_of(new), contract.ENV_STATUS_KEY_FILE: str(key_file)})
        document = after_test(namespace, name, 1, 9.0)
        server = StatusServer("127.0.0.1", port, lambda: document, status_signer(settings))
        server.start()
        try:
            passed = wait_until(
                lambda: (c := condition(cluster, namespace, name, "Preflight"))
                and c["status"] == "True" and c,
                60, "the new gang's test passed",
            )  # fmt: skip
        finally:
            server.stop()
        assert passed["reason"] == "PreflightPassed"
        assert "slowest rank 0 9 Gbit/s" in passed["message"]
        status = job(cluster, namespace, name)["status"]
        assert (status["preflight"]["attempt"], status["preflight"]["failures"]) == (1, 0)
        assert status["phase"] == "Running"
        assert preflight_metric(running_operator, "failed") == failed_before + 1
        assert preflight_metric(running_operator, "passed") == passed_before + 1
    finally:
        cluster.kubectl("annotate", "node", node, f"{contract.ANNOTATION_STRAGGLER_UNTIL}-")
