"""SIGKILL the operator while it reconciles 20 jobs: nothing lost, nothing duplicated."""

import os
import subprocess
import time

import pytest

from cluster.controlplane import tool
from integration.trainwave_fixtures import apply, get_json, job_manifest, jobs_by_name, wait_until
from trainwave.contract import LABEL_JOB_NAME

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

# name prefix -> (how many, manifest options, expected phase, reason, attempts)
MIX = {
    "ok": (10, {"workers": 2, "run_for": "4s"}, "Succeeded", "Succeeded", 1),
    "flaky": (5, {"workers": 2, "result": "Failed", "exit_code": 1, "run_for": "2s",
                  "run_policy": {"failurePolicy": {"maxRestarts": 1}}},
              "Failed", "MaxRestartsExceeded", 2),
    "usererror": (5, {"workers": 2, "result": "Failed", "exit_code": 3, "run_for": "2s",
                      "run_policy": {"failurePolicy": {"rules": [
                          {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [3]}}]}}},
                  "Failed", "FailedByRule", 1),
}  # fmt: skip


def _jobs():
    for prefix, (count, options, phase, reason, attempts) in MIX.items():
        for index in range(count):
            yield f"{prefix}-{index}", options, phase, reason, attempts


def test_sigkill_during_reconcile_loses_and_duplicates_nothing(
    cluster, namespace, running_operator
):
    # Every pod name that ever exists in the namespace, from a watch started first.
    watch = subprocess.Popen(
        [str(tool("kubectl")), "get", "pods", "-n", namespace, "--watch", "-o", "name"],
        stdout=subprocess.PIPE, text=True, env=os.environ | {"KUBECONFIG": str(cluster.kubeconfig)},
    )  # fmt: skip
    try:
        apply(cluster, namespace, *(job_manifest(name, **options) for name, options, *_ in _jobs()))
        for pause in (0.5, 2.0, 3.0):
            time.sleep(pause)
            running_operator.kill()
            time.sleep(1.0)  # events pile up while nobody watches
            running_operator.start()

        def all_terminal():
            found = jobs_by_name(cluster, namespace)
            phases = {name: found.get(name, {}).get("status", {}).get("phase")
                      for name, *_ in _jobs()}  # fmt: skip
            return phases if all(p in ("Succeeded", "Failed") for p in phases.values()) else None

        wait_until(all_terminal, 180, "all 20 jobs terminal", interval=1)
        ended = jobs_by_name(cluster, namespace)
        for name, _, phase, reason, attempts in _jobs():
            status = ended[name]["status"]
            assert (status["phase"], status["reason"]) == (phase, reason), name
            assert status["attempt"] == attempts - 1, name
            assert status["restarts"] == (
                attempts - 1 if phase == "Failed" and reason != "FailedByRule" else 0
            )
    finally:
        watch.terminate()
        seen, _ = watch.communicate(timeout=10)

    created = {line.removeprefix("pod/") for line in seen.split()}
    expected = {
        f"{name}-a{attempt}-worker-{rank}"
        for name, options, _, _, attempts in _jobs()
        for attempt in range(attempts)
        for rank in range(options["workers"])
    }
    # A job failed by rule may end before its gang is complete: killed between its two
    # creates, the operator comes back after worker 0 already exited with the rule's code
    # and fails the job at once (correct), so worker 1 is never created. Only such a
    # job's later workers may be missing; worker 0, and every other job's pods, may not.
    may_miss = {
        f"{name}-a0-worker-{rank}"
        for name, options, _, reason, _ in _jobs()
        if reason == "FailedByRule"
        for rank in range(1, options["workers"])
    }
    extra, missing = created - expected, expected - created
    assert not extra, f"extra: {extra}"
    assert missing <= may_miss, f"missing: {missing - may_miss}"

    cluster.kubectl("delete", "tj", "--all", "-n", namespace, "--wait=true", timeout=120)
    wait_until(lambda: get_json(cluster, namespace, "pods", "-l", LABEL_JOB_NAME)["items"] == [],
               90, "every pod garbage-collected")  # fmt: skip
    services = cluster.kubectl("get", "svc", "-n", namespace, "-o", "name").stdout.split()
    assert services == []
