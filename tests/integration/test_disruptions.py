"""The disruption-aware failure policy on the real control plane: an eviction through the
Eviction API, a deleted node and a node gone NotReady restart the gang without spending
maxRestarts; an always-OOM job under the old `Ignore 137` recipe ends instead of looping."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from cluster.controlplane import Cluster
from cluster.topology import KWOK_NODE_ANNOTATION
from integration.node_pools import Pool, node_pool
from integration.trainwave_fixtures import (
    apply,
    job,
    job_manifest,
    wait_for_phase,
    wait_until,
    worker_pods,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

# maxRestarts 0: any restart the policy counted as a failure would fail the job at once.
NO_RESTARTS: dict[str, Any] = {"failurePolicy": {"maxRestarts": 0}}


def running_pods(cluster: Cluster, namespace: str, name: str, attempt: int) -> list[dict[str, Any]]:
    return [
        p for p in worker_pods(cluster, namespace, name)
        if p["metadata"]["labels"]["trainwave.io/attempt"] == str(attempt)
        and p["status"].get("phase") == "Running"
        and not p["metadata"].get("deletionTimestamp")
    ]  # fmt: skip


def running_again(cluster: Cluster, namespace: str, name: str, attempt: int) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        body = job(cluster, namespace, name)
        status = body.get("status", {})
        if status.get("attempt") == attempt and status.get("phase") == "Running":
            return body
        return None

    found: dict[str, Any] = wait_until(check, 120, f"{name} Running again as attempt {attempt}")
    return found


def test_an_evicted_worker_restarts_the_gang_as_a_disruption(cluster, namespace, running_operator):
    apply(cluster, namespace, job_manifest("evicted", workers=2, result=None,
                                           run_policy=NO_RESTARTS))  # fmt: skip
    wait_for_phase(cluster, namespace, "evicted", "Running")
    victim = "evicted-a0-worker-1"
    eviction = {"apiVersion": "policy/v1", "kind": "Eviction",
                "metadata": {"name": victim, "namespace": namespace}}  # fmt: skip
    cluster.kubectl("create", "--raw", f"/api/v1/namespaces/{namespace}/pods/{victim}/eviction",
                    "-f", "-", input=json.dumps(eviction))  # fmt: skip

    body = running_again(cluster, namespace, "evicted", 1)
    status = body["status"]
    assert (status["restarts"], status["disruptions"]) == (0, 1)
    message = disrupted_message(cluster, namespace, "evicted")
    assert "worker 1 (evicted-a0-worker-1) was disrupted" in message
    assert "DisruptionTarget: EvictionByEvictionAPI" in message
    assert "disruption 1 of 20" in message


def test_a_deleted_node_restarts_the_gang_elsewhere(cluster, namespace, running_operator):
    with node_pool(cluster, rack_sizes=(3,)) as pool:
        apply(cluster, namespace, pool_job("lostnode", pool))
        wait_for_phase(cluster, namespace, "lostnode", "Running")
        doomed = running_pods(cluster, namespace, "lostnode", 0)[0]["spec"]["nodeName"]
        cluster.kubectl("delete", "node", doomed, "--wait=false")

        status = running_again(cluster, namespace, "lostnode", 1)["status"]
        assert (status["restarts"], status["disruptions"]) == (0, 1)
        assert doomed not in {p["spec"]["nodeName"] for p in running_pods(
            cluster, namespace, "lostnode", 1)}  # fmt: skip
        assert f"lost its node {doomed} (NodeLost)" in disrupted_message(cluster, namespace,
                                                                         "lostnode")  # fmt: skip


def test_a_node_not_ready_past_the_grace_restarts_the_gang(cluster, namespace, running_operator):
    with node_pool(cluster, rack_sizes=(3,)) as pool:
        policy = {"failurePolicy": {"maxRestarts": 0, "nodeNotReadySeconds": 3}}
        apply(cluster, namespace, pool_job("flaky", pool, run_policy=policy))
        wait_for_phase(cluster, namespace, "flaky", "Running")
        sick = running_pods(cluster, namespace, "flaky", 0)[0]["spec"]["nodeName"]
        make_not_ready(cluster, sick)

        status = running_again(cluster, namespace, "flaky", 1)["status"]
        assert (status["restarts"], status["disruptions"]) == (0, 1)
        assert f"lost its node {sick} (NodeNotReady)" in disrupted_message(cluster, namespace,
                                                                           "flaky")  # fmt: skip


def test_always_oom_under_the_old_ignore_137_recipe_ends(cluster, namespace, running_operator):
    policy = {"failurePolicy": {
        "maxRestarts": 5, "maxIgnoredRestarts": 2, "ignoreBackoffSeconds": 1,
        "rules": [{"action": "Ignore", "onExitCodes": {"operator": "In", "values": [137]}}],
    }}  # fmt: skip
    apply(cluster, namespace, oom_job("oomloop", policy))
    failed = wait_for_phase(cluster, namespace, "oomloop", "Failed", timeout=120)
    status = failed["status"]
    assert status["reason"] == "MaxIgnoredRestartsExceeded"
    assert (status["ignoredRestarts"], status["restarts"], status["attempt"]) == (2, 0, 2)
    assert "exited with code 137 (OOMKilled)" in status["message"]
    ignored = [e for e in cluster_events(cluster, namespace, "oomloop")
               if e["reason"] == "FailureIgnored"]  # fmt: skip
    assert len(ignored) == 2
    assert "in 1s" in ignored[0]["message"] or "in 2s" in ignored[0]["message"]


def test_on_reasons_oomkilled_fails_at_once(cluster, namespace, running_operator):
    policy = {"failurePolicy": {"rules": [
        {"action": "FailJob", "onReasons": ["OOMKilled"]},
        {"action": "Ignore", "onExitCodes": {"operator": "In", "values": [137]}},
    ]}}  # fmt: skip
    apply(cluster, namespace, oom_job("oomfail", policy))
    failed = wait_for_phase(cluster, namespace, "oomfail", "Failed", timeout=90)
    assert failed["status"]["reason"] == "FailedByRule"
    assert (failed["status"]["attempt"], failed["status"]["ignoredRestarts"]) == (0, 0)
    assert "(failurePolicy.rules[0]: FailJob)" in failed["status"]["message"]


def test_the_api_server_refuses_a_rule_with_two_matchers(cluster, namespace, running_operator):
    rule = {"action": "FailJob", "onReasons": ["OOMKilled"],
            "onExitCodes": {"operator": "In", "values": [1]}}  # fmt: skip
    manifest = job_manifest("tworules", run_policy={"failurePolicy": {"rules": [rule]}})
    result = cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(manifest),
                             check=False)  # fmt: skip
    assert result.returncode != 0
    assert "spec.runPolicy.failurePolicy.rules[0]" in result.stderr
    assert "exactly one of onExitCodes, onPodConditions, onReasons" in result.stderr


def oom_job(name: str, policy: dict[str, Any]) -> dict[str, Any]:
    manifest = job_manifest(name, workers=2, result="Failed", exit_code=137, run_for="1s",
                            run_policy=policy)  # fmt: skip
    manifest["spec"]["template"]["metadata"]["annotations"]["sim.trainwave.io/reason"] = "OOMKilled"
    return manifest


def pool_job(name: str, pool: Pool, **options: Any) -> dict[str, Any]:
    """Two 8-GPU workers on the pool's 8-GPU nodes: one per node, one node to spare."""
    return job_manifest(name, workers=2, gpus=8, result=None,
                        run_policy=options.pop("run_policy", NO_RESTARTS),
                        template_spec={"nodeSelector": pool.selector}, **options)  # fmt: skip


def make_not_ready(cluster: Cluster, node: str) -> None:
    """As if its kubelet stopped answering: kwok lets go of the node (it would make it Ready
    again at once, and it stops playing its pods, as a dead kubelet would), then Ready=False."""
    cluster.kubectl("annotate", "node", node, f"{KWOK_NODE_ANNOTATION}-")
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    condition = {"type": "Ready", "status": "False", "reason": "KubeletNotReady",
                 "message": "the test stopped the kubelet", "lastTransitionTime": now}  # fmt: skip
    patch = json.dumps({"status": {"conditions": [condition]}})
    cluster.kubectl("patch", "node", node, "--subresource=status", "--type=strategic", "-p", patch)


def disrupted_message(cluster: Cluster, namespace: str, name: str) -> str:
    """The message of the job's one WorkerDisrupted Event."""
    (event,) = [e for e in cluster_events(cluster, namespace, name)
                if e["reason"] == "WorkerDisrupted"]  # fmt: skip
    return str(event["message"])


def cluster_events(cluster: Cluster, namespace: str, name: str) -> list[dict[str, Any]]:
    items = json.loads(cluster.kubectl("get", "events", "-n", namespace, "-o", "json").stdout)
    return [e for e in items["items"] if e["involvedObject"]["name"] == name]
