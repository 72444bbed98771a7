"""Priority preemption of whole gangs on the real control plane."""

from __future__ import annotations

import time

import pytest

from integration.node_pools import node_pool
from integration.trainwave_fixtures import (
    apply,
    condition,
    events_about,
    job,
    job_manifest,
    wait_for_phase,
    worker_pods,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def pool_job(name, pool, *, workers, priority=0, preemptible=True):
    manifest = job_manifest(
        name, workers=workers, gpus=8, run_for="600s",
        template_spec={"nodeSelector": pool.selector},
    )  # fmt: skip
    manifest["spec"]["placement"] = {"priority": priority, "preemptible": preemptible}
    return manifest


def test_a_higher_priority_gang_preempts_a_whole_lower_one_uncounted(
    cluster, namespace, running_operator
):
    with node_pool(cluster, rack_sizes=(2,)) as pool:
        apply(cluster, namespace, pool_job("low", pool, workers=2))
        wait_for_phase(cluster, namespace, "low", "Running")
        apply(cluster, namespace, pool_job("high", pool, workers=1, priority=10))
        wait_for_phase(cluster, namespace, "high", "Running", timeout=60)

        low = wait_for_phase(cluster, namespace, "low", ("Scheduling", "Pending"))
        status = low["status"]
        assert (status["attempt"], status["restarts"], status["preemptions"]) == (1, 0, 1)
        preempted = condition(low, "Preempted")
        assert preempted is not None
        assert preempted["status"] == "True"
        assert f"{namespace}/high" in preempted["message"]
        events_about(cluster, namespace,
                     lambda e: e.get("reason") == "Preempted" and "high" in e.get("note", ""),
                     "a Preempted Event naming the preemptor")  # fmt: skip
        # The whole gang went, not one worker; the new attempt waits behind the gate.
        attempts = {p["metadata"]["labels"]["trainwave.io/attempt"] for p in
                    worker_pods(cluster, namespace, "low") if not p["metadata"].get("deletionTimestamp")}  # fmt: skip
        assert attempts == {"1"}

        time.sleep(8)  # several placement rounds: the victim is not preempted again
        assert job(cluster, namespace, "low")["status"]["preemptions"] == 1
        assert job(cluster, namespace, "high")["status"]["phase"] == "Running"


def test_a_non_preemptible_gang_is_never_a_victim(cluster, namespace, running_operator):
    with node_pool(cluster, rack_sizes=(1,)) as pool:
        apply(cluster, namespace, pool_job("guarded", pool, workers=1, preemptible=False))
        wait_for_phase(cluster, namespace, "guarded", "Running")
        apply(cluster, namespace, pool_job("urgent", pool, workers=1, priority=10))
        wait_for_phase(cluster, namespace, "urgent", "Scheduling")
        time.sleep(8)
        assert job(cluster, namespace, "guarded")["status"]["phase"] == "Running"
        assert job(cluster, namespace, "guarded")["status"].get("preemptions", 0) == 0
        assert job(cluster, namespace, "urgent")["status"]["phase"] == "Scheduling"
