"""A worker the API server refuses (here a ResourceQuota) is never a silent retry."""

from __future__ import annotations

import json
import time

import pytest

from integration.trainwave_fixtures import (
    apply,
    condition,
    events_about,
    job,
    job_manifest,
    wait_for_phase,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def test_a_quota_refusal_shows_on_the_job_and_clears_when_the_quota_allows(
    cluster, namespace, running_operator
):
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "two-pods"},
        "spec": {"hard": {"pods": "1"}},
    }
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(quota))
    apply(cluster, namespace, job_manifest("capped", workers=2, gpus=1, run_for="60s"))

    def refused():
        found = condition(job(cluster, namespace, "capped"), "ReplicaFailure")
        return found if found and found["status"] == "True" else None

    found = wait_until(refused, 60, "a ReplicaFailure condition")
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
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "no-services"},
        "spec": {"hard": {"services": "0"}},
    }
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(quota))
    apply(cluster, namespace, job_manifest("nameless", workers=2, gpus=1, result=None))

    def refused():
        found = condition(job(cluster, namespace, "nameless"), "ReplicaFailure")
        return found if found and found["status"] == "True" else None

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
