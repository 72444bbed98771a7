"""A worker the API server refuses (here a ResourceQuota) is never a silent retry."""

from __future__ import annotations

import json
import time

import pytest

from integration.trainwave_fixtures import (
    apply,
    condition,
    events_about,
    get_json,
    job,
    job_manifest,
    wait_for_phase,
    wait_until,
    worker_pods,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def add_quota(cluster, namespace, name, hard):
    quota = {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": name},
             "spec": {"hard": hard}}  # fmt: skip
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(quota))


def replica_failure(cluster, namespace, name):
    """The job's ReplicaFailure condition while it is True, else None."""
    found = condition(job(cluster, namespace, name), "ReplicaFailure")
    return found if found and found["status"] == "True" else None


def test_a_quota_refusal_shows_on_the_job_and_clears_when_the_quota_allows(
    cluster, namespace, running_operator
):
    add_quota(cluster, namespace, "two-pods", {"pods": "1"})
    apply(cluster, namespace, job_manifest("capped", workers=2, gpus=1, run_for="60s"))
    found = wait_until(lambda: replica_failure(cluster, namespace, "capped"), 60,
                       "a ReplicaFailure condition")  # fmt: skip
    assert found["reason"] == "FailedCreate"
    assert "exceeded quota" in found["message"], found["message"]
    assert f"pod {namespace}/capped-a0-worker-" in found["message"], "names the object"
    events_about(cluster, namespace, lambda e: e.get("reason") == "FailedCreate",
                 "a FailedCreate Warning Event")  # fmt: skip

    cluster.kubectl("delete", "resourcequota", "two-pods", "-n", namespace)
    body = wait_for_phase(cluster, namespace, "capped", ("Running", "Succeeded"), timeout=90)
    assert condition(body, "ReplicaFailure")["status"] == "False"


def test_a_refused_service_shows_on_the_running_job_and_is_created_when_the_quota_allows(
    cluster, namespace, running_operator
):
    """The Service comes once every worker has an address, so its refusal meets a job
    whose workers already run: said once on the job, retried, cleared once it exists."""
    add_quota(cluster, namespace, "no-services", {"services": "0"})
    apply(cluster, namespace, job_manifest("nameless", workers=2, gpus=1, result=None))

    def refused():
        return replica_failure(cluster, namespace, "nameless")

    found = wait_until(refused, 60, "a ReplicaFailure condition")
    assert found["message"].startswith(f"creating service {namespace}/nameless failed"), found
    assert "exceeded quota" in found["message"], found["message"]
    assert job(cluster, namespace, "nameless")["status"]["phase"] == "Running"
    time.sleep(8)  # a few retries with backoff (2, 4 s)
    said = events_about(cluster, namespace, lambda e: e.get("reason") == "FailedCreate"
                        and e["regarding"]["name"] == "nameless", "a FailedCreate Event")  # fmt: skip
    assert len(said) == 1, [e.get("note") for e in said]
    assert refused(), "still on the job while the quota refuses"

    cluster.kubectl("delete", "resourcequota", "no-services", "-n", namespace)
    wait_until(lambda: cluster.kubectl("get", "service", "nameless", "-n", namespace,
                                       check=False).returncode == 0,
               90, "the Service, once the quota allows")  # fmt: skip
    wait_until(lambda: not refused(), 30, "the condition cleared")


def test_a_pod_holding_a_worker_s_name_shows_on_the_job_until_it_is_gone(
    cluster, namespace, running_operator
):
    """As a job deleted and created again under the same name meets its old pods while
    they terminate: the operator creates its pods, and the one it cannot create says so."""
    squatter = {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "taken-a0-worker-0"},
                "spec": {"schedulingGates": [{"name": "test.trainwave.io/hold"}],
                         "containers": [{"name": "c", "image": "bench:1"}]}}  # fmt: skip
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(squatter))
    apply(cluster, namespace, job_manifest("taken", workers=2, gpus=1, run_for="60s"))
    found = wait_until(lambda: replica_failure(cluster, namespace, "taken"), 60,
                       "a ReplicaFailure condition")  # fmt: skip
    assert f"pod {namespace}/taken-a0-worker-0" in found["message"], found["message"]
    assert "a pod of that name exists already, owned by nothing" in found["message"], found

    cluster.kubectl("delete", "pod", "taken-a0-worker-0", "-n", namespace, "--wait=true")
    body = wait_for_phase(cluster, namespace, "taken", ("Running", "Succeeded"), timeout=90)
    assert condition(body, "ReplicaFailure")["status"] == "False"
    pod = json.loads(cluster.kubectl("get", "pod", "taken-a0-worker-0", "-n", namespace,
                                     "-o", "json").stdout)  # fmt: skip
    assert pod["metadata"]["ownerReferences"][0]["name"] == "taken"


def test_a_gang_meeting_an_old_worker_of_its_name_runs_whole_or_not_at_all(
    cluster, namespace, running_operator
):
    """A job deleted and applied again while one of its old workers still holds a node:
    the new gang's other pods must not run beside the name it cannot create yet (all
    workers or none), so they wait behind the gate until the old worker is gone."""
    old = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "again-a0-worker-0",
                        "labels": {"trainwave.io/job-name": "again", "trainwave.io/role": "worker",
                                   "trainwave.io/rank": "0", "trainwave.io/attempt": "0"}},
           "spec": {"restartPolicy": "Never",
                    "containers": [{"name": "c", "image": "bench:1",
                                    "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}  # fmt: skip
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(old))
    wait_until(lambda: get_json(cluster, namespace, "pod", "again-a0-worker-0")["spec"].get("nodeName"),
               60, "the old worker bound")  # fmt: skip
    apply(cluster, namespace, job_manifest("again", workers=2, gpus=1, run_for="60s"))
    found = wait_until(lambda: replica_failure(cluster, namespace, "again"), 60,
                       "a ReplicaFailure condition")  # fmt: skip
    assert f"pod {namespace}/again-a0-worker-0" in found["message"], found["message"]
    time.sleep(3)  # the reconciles that retry meanwhile must not release worker 1 either
    worker = get_json(cluster, namespace, "pod", "again-a0-worker-1")
    assert worker["spec"].get("schedulingGates"), "worker 1 runs without worker 0"
    assert not worker["spec"].get("nodeName"), worker["spec"].get("nodeName")

    cluster.kubectl("delete", "pod", "again-a0-worker-0", "-n", namespace, "--wait=true")
    body = wait_for_phase(cluster, namespace, "again", ("Running", "Succeeded"), timeout=90)
    assert condition(body, "ReplicaFailure")["status"] == "False"
    pods = {p["metadata"]["name"]: p for p in worker_pods(cluster, namespace, "again")}
    assert {p["metadata"]["ownerReferences"][0]["name"] for p in pods.values()} == {"again"}
