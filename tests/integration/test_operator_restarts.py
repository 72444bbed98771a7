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
    # A gang that ends in a failure may end before it is complete: killed between two
    # creates, the operator comes back after a worker it did create already exited with
    # a failure, and ends that gang at once (correct: a restart replaces the whole gang, a
    # rule or an exhausted budget fails the job), so the rest of it is never created.
    # Creations have no fixed order (seen: attempt 1's worker 1 created and failed, worker
    # 0 never; attempt 0's worker 1 never created before attempt 1 started). Every gang
    # of a failing job ends in a failure, so each must show at least one worker, the one
    # whose end failed it; every pod of a job that succeeds must exist.
    failed_gangs = [
        {f"{name}-a{attempt}-worker-{rank}" for rank in range(options["workers"])}
        for name, options, phase, _, attempts in _jobs()
        if phase == "Failed"
        for attempt in range(attempts)
    ]
    may_miss = set().union(*failed_gangs)
    extra, missing = created - expected, expected - created
    assert not extra, f"extra: {extra}"
    assert missing <= may_miss, f"missing: {missing - may_miss}"
    assert all(gang & created for gang in failed_gangs), f"missing: {missing}"

    cluster.kubectl("delete", "tj", "--all", "-n", namespace, "--wait=true", timeout=120)
    wait_until(lambda: get_json(cluster, namespace, "pods", "-l", LABEL_JOB_NAME)["items"] == [],
               90, "every pod garbage-collected")  # fmt: skip
    services = cluster.kubectl("get", "svc", "-n", namespace, "-o", "name").stdout.split()
    assert services == []
