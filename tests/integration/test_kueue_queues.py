"""Kueue admission of TrainingJobs with the real Kueue manager on the real control plane:
v0.17.0, or the version in $TRAINWAVE_KUEUE_VERSION (v0.11.9 is the other one tested).

The module's operator runs with --kueue and the chart's kueue RBAC; the session's
operator (without them) is stopped meanwhile so only one operator leads, and
started again afterwards. Each test brings a private node pool, a ResourceFlavor
whose node labels select it, a ClusterQueue and a LocalQueue, at the API version
the API server prefers (kueue.x-k8s.io/v1beta2 from Kueue v0.15, v1beta1 before),
the one the operator discovers and uses too.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from cluster.controlplane import Cluster
from cluster.deploy import OperatorProcess, install_chart
from cluster.kueue import KueueManager, preferred_version, start_kueue
from integration.node_pools import H100, Pool, node_pool
from integration.trainwave_fixtures import (
    apply,
    condition,
    events_about,
    get_json,
    job,
    job_manifest,
    nothing_waits,
    placed_at_creation,
    wait_for_phase,
    wait_until,
    worker_pods,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

TAINT = {"key": "test.trainwave.io/kueue-only", "value": "yes", "effect": "NoSchedule"}


@pytest.fixture(scope="module")
def kueue(
    trainwave_installed: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KueueManager]:
    manager = start_kueue(trainwave_installed, tmp_path_factory.mktemp("kueue"))
    yield manager
    manager.stop()


@pytest.fixture(scope="module")
def kueue_operator(
    kueue: KueueManager, operator: OperatorProcess, trainwave_installed: Cluster,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[OperatorProcess]:  # fmt: skip
    operator.stop()
    install_chart(trainwave_installed, "--set", "kueue.enabled=true")
    log = tmp_path_factory.mktemp("kueue-operator") / "operator.log"
    mine = OperatorProcess(kubeconfig=operator.kubeconfig, log_path=log, extra_args=("--kueue",))
    mine.start()
    yield mine
    mine.stop()
    install_chart(trainwave_installed)
    operator.start()


@contextmanager
def cluster_queue(
    cluster: Cluster, namespace: str, pool: Pool, quota: dict[str, str], *,
    tolerations: list[dict[str, str]] | None = None, preemption: bool = False,
) -> Iterator[str]:  # fmt: skip
    """A flavor on `pool`'s nodes, a ClusterQueue with `quota` of it, a LocalQueue in
    `namespace`; its name is returned (the queue-name label's value)."""
    name = f"q{uuid.uuid4().hex[:6]}"
    api = preferred_version(cluster)
    flavor: dict[str, Any] = {"nodeLabels": pool.selector}
    if tolerations:
        flavor["tolerations"] = tolerations
    queue_spec: dict[str, Any] = {
        "namespaceSelector": {},  # nil would admit no namespace
        "resourceGroups": [{
            "coveredResources": sorted(quota),
            "flavors": [{"name": name, "resources": [
                {"name": r, "nominalQuota": q} for r, q in sorted(quota.items())]}],
        }],
    }  # fmt: skip
    if preemption:
        queue_spec["preemption"] = {"withinClusterQueue": "LowerPriority"}
    objects = [
        {"apiVersion": api, "kind": "ResourceFlavor", "metadata": {"name": name}, "spec": flavor},
        {"apiVersion": api, "kind": "ClusterQueue", "metadata": {"name": name}, "spec": queue_spec},
        {"apiVersion": api, "kind": "LocalQueue", "metadata": {"name": name},
         "spec": {"clusterQueue": name}},
    ]  # fmt: skip
    apply(cluster, namespace, *objects)
    try:
        yield name
    finally:
        for kind in ("clusterqueue", "resourceflavor"):
            cluster.kubectl("delete", kind, name, "--wait=false", check=False)


def queued_job(name: str, queue: str, *, workers: int = 1, gpus: int = 8, run_for: str = "600s",
               priority: int = 0, **spec: Any) -> dict[str, Any]:  # fmt: skip
    manifest = job_manifest(name, workers=workers, gpus=gpus, run_for=run_for, **spec)
    manifest["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": queue}
    manifest["spec"]["placement"] = {"priority": priority}
    return manifest


def workload_of(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    items = get_json(cluster, namespace, "workloads.kueue.x-k8s.io", "--show-managed-fields",
                     "-l", f"trainwave.io/job-name={name}")["items"]  # fmt: skip
    assert len(items) == 1, f"{name}: expected one Workload, found {len(items)}"
    return dict(items[0])


def workload_condition(workload: dict[str, Any], kind: str) -> str:
    found = condition(workload, kind)
    return found["status"] if found else ""


def live_pods(cluster: Cluster, namespace: str, name: str) -> list[dict[str, Any]]:
    return [p for p in worker_pods(cluster, namespace, name)
            if not p["metadata"].get("deletionTimestamp")]  # fmt: skip


def written_at(workload: dict[str, Any]) -> set[str]:
    """The API versions trainwave's writes to a Workload were made at (its managedFields)."""
    fields = workload["metadata"].get("managedFields") or []
    return {f["apiVersion"] for f in fields if f.get("manager") == "trainwave"}


def test_past_kueues_pod_webhook_a_job_outside_kueue_is_created_placed(
    cluster, namespace, kueue_operator
):
    """Kueue's release registers a mutating webhook for pod CREATE in every namespace but
    two, even with its pod integration off. First in the module: no earlier test's gang
    still waits, which would keep any new gang from being placed at creation. The operator's dry run of the gang's first
    placed pod finds it unchanged: created placed, one write per worker, as without Kueue."""
    configuration = get_json(
        cluster, "", "mutatingwebhookconfiguration", "kueue-mutating-webhook-configuration"
    )
    [pods_hook] = [w for w in configuration["webhooks"] if w["name"] == "mpod.kb.io"]
    assert pods_hook["clientConfig"]["url"].endswith("/mutate--v1-pod")
    wait_until(lambda: nothing_waits(cluster), 120, "no gang waiting anywhere")
    with node_pool(cluster, rack_sizes=(2,)) as pool:
        before = placed_at_creation(kueue_operator)
        manifest = job_manifest("outside", workers=2, gpus=8, run_for="60s",
                                template_spec={"nodeSelector": pool.selector})  # fmt: skip
        apply(cluster, namespace, manifest)
        wait_for_phase(cluster, namespace, "outside", "Running")
        assert placed_at_creation(kueue_operator) == before + 1
        pods = worker_pods(cluster, namespace, "outside")
        assert sorted(p["spec"]["nodeName"] for p in pods) == sorted(pool.nodes)
        assert "kueue.x-k8s.io/queue-name" not in pods[0]["metadata"].get("labels", {})


def test_a_16_gpu_quota_admits_two_8_gpu_jobs_and_holds_the_third(
    cluster, namespace, kueue, kueue_operator
):
    with (
        node_pool(cluster, rack_sizes=(3,)) as pool,
        cluster_queue(cluster, namespace, pool, {"nvidia.com/gpu": "16"}) as queue,
    ):
        apply(cluster, namespace, queued_job("first", queue, run_for="15s"),
              queued_job("second", queue))  # fmt: skip
        wait_for_phase(cluster, namespace, "first", "Running")
        wait_for_phase(cluster, namespace, "second", "Running")
        apply(cluster, namespace, queued_job("third", queue))
        held = wait_until(
            lambda: (b := job(cluster, namespace, "third")).get("status", {}).get("reason")
            == "Queued" and b, 30, "third job queued",
        )  # fmt: skip
        status = held["status"]
        assert status["phase"] == "Pending"
        assert f"waiting for Kueue admission in LocalQueue {queue}" in status["message"]
        assert condition(held, "Admitted")["status"] == "False"
        assert live_pods(cluster, namespace, "third") == []
        events_about(cluster, namespace, lambda e: e.get("reason") == "Queued"
                     and e["regarding"]["name"] == "third", "a Queued Event")  # fmt: skip
        # Kueue's own reason reaches an Event too (not only the status), where `kubectl
        # describe` readers look; posted once, not on every resync.
        kueue_says = "insufficient unused quota for nvidia.com/gpu"
        said = events_about(
            cluster, namespace,
            lambda e: e["regarding"]["name"] == "third" and kueue_says in (e.get("note") or "")
            and e.get("reason") in ("Queued", "KueuePending"),
            "an Event with Kueue's reason", timeout=30,
        )  # fmt: skip
        assert said[0]["note"].startswith(f"waiting for Kueue admission in LocalQueue {queue}: ")
        assert (
            workload_condition(workload_of(cluster, namespace, "third"), "QuotaReserved") == "False"
        )
        # The operator created it at the version it discovered: the preferred one.
        assert written_at(workload_of(cluster, namespace, "third")) == {kueue.api_version}

        time.sleep(3)  # resyncs and Workload updates meanwhile post no second one
        again = [
            e
            for e in get_json(cluster, namespace, "events.events.k8s.io")["items"]
            if e["regarding"]["name"] == "third" and kueue_says in (e.get("note") or "")
        ]
        assert len(again) == 1, [e["note"] for e in again]

        # The first ends: its Workload is Finished, the quota freed, the third admitted.
        wait_for_phase(cluster, namespace, "first", "Succeeded", timeout=60)
        wait_until(lambda: workload_condition(workload_of(cluster, namespace, "first"), "Finished")
                   == "True", 30, "first's Workload Finished")  # fmt: skip
        # Created and its status written (Finished) at that version.
        assert written_at(workload_of(cluster, namespace, "first")) == {kueue.api_version}
        third = wait_for_phase(cluster, namespace, "third", "Running", timeout=60)
        assert condition(third, "Admitted")["status"] == "True"
        assert job(cluster, namespace, "second")["status"]["phase"] == "Running"
        # The Workload is the job's child: garbage collection removes it with the job.
        owner = workload_of(cluster, namespace, "third")["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["uid"]) == ("TrainingJob", third["metadata"]["uid"])


def test_the_admitted_flavors_node_labels_and_tolerations_reach_the_workers(
    cluster, namespace, kueue_operator
):
    with node_pool(cluster, rack_sizes=(1,)) as pool:
        [node] = pool.nodes
        cluster.kubectl("taint", "node", node, f"{TAINT['key']}={TAINT['value']}:{TAINT['effect']}")
        toleration = {**TAINT, "operator": "Equal"}
        with cluster_queue(cluster, namespace, pool, {"nvidia.com/gpu": "8"},
                           tolerations=[toleration]) as queue:  # fmt: skip
            # No nodeSelector of its own: only the flavor can lead it to the tainted pool.
            apply(cluster, namespace, queued_job("flavored", queue))
            wait_for_phase(cluster, namespace, "flavored", "Running")
            [pod] = live_pods(cluster, namespace, "flavored")
            assert pod["spec"]["nodeName"] == node
            assert pod["spec"]["nodeSelector"].items() >= pool.selector.items()
            assert toleration in pod["spec"]["tolerations"]


def test_kueue_preemption_restarts_the_victim_uncounted(cluster, namespace, kueue_operator):
    with (
        node_pool(cluster, rack_sizes=(2,)) as pool,
        cluster_queue(cluster, namespace, pool, {"nvidia.com/gpu": "16"}, preemption=True) as queue,
    ):
        apply(cluster, namespace, queued_job("low", queue, workers=2))
        wait_for_phase(cluster, namespace, "low", "Running")
        apply(cluster, namespace, queued_job("high", queue, priority=10))
        wait_for_phase(cluster, namespace, "high", "Running", timeout=90)

        low = job(cluster, namespace, "low")
        status = low["status"]
        assert status["phase"] == "Pending"
        assert status["reason"] == "Preempted"
        assert (status["attempt"], status["restarts"], status["preemptions"]) == (1, 0, 1)
        assert status.get("disruptions", 0) == 0
        assert "preempted by Kueue" in condition(low, "Preempted")["message"]
        assert live_pods(cluster, namespace, "low") == []
        # The quota was given back as Kueue's jobframework gives it back.
        workload = workload_of(cluster, namespace, "low")
        assert "admission" not in workload["status"]
        assert workload_condition(workload, "Requeued") == "True"
        assert workload_condition(workload, "QuotaReserved") == "False"


def test_shared_gpu_jobs_are_counted_in_gpu_memory(cluster, namespace, kueue_operator):
    shape = {"cpu": "192", "gpu": {**H100, "count": 2, "shared": True}}
    # 60 GiB of GPU memory in MiB, the unit shared workers request trainwave.io/gpu-memory in.
    with (
        node_pool(cluster, rack_sizes=(1,), shape=shape) as pool,
        cluster_queue(
            cluster, namespace, pool, {"trainwave.io/gpu-memory": str(60 * 1024)}
        ) as queue,
    ):
        names = ("share-a", "share-b", "share-c")
        for name in names:
            apply(
                cluster, namespace, queued_job(name, queue, gpus=0, gpuSharing={"memory": "30Gi"})
            )

        def two_running_one_queued() -> str | None:
            seen = {n: job(cluster, namespace, n).get("status", {}) for n in names}
            running = [n for n, s in seen.items() if s.get("phase") == "Running"]
            queued = [n for n, s in seen.items() if s.get("reason") == "Queued"]
            return queued[0] if len(running) == 2 and len(queued) == 1 else None

        held = wait_until(two_running_one_queued, 90, "two shared jobs running, one queued")
        assert "trainwave.io/gpu-memory" in job(cluster, namespace, held)["status"]["message"]
        assert live_pods(cluster, namespace, held) == []
        workload = workload_of(cluster, namespace, held)
        worker = workload["spec"]["podSets"][0]["template"]["spec"]["containers"][0]
        assert str(worker["resources"]["limits"]["trainwave.io/gpu-memory"]) == str(30 * 1024)


def test_a_suspended_job_gives_its_quota_back(cluster, namespace, kueue_operator):
    with (
        node_pool(cluster, rack_sizes=(2,)) as pool,
        cluster_queue(cluster, namespace, pool, {"nvidia.com/gpu": "8"}) as queue,
    ):
        apply(cluster, namespace, queued_job("paused", queue))
        wait_for_phase(cluster, namespace, "paused", "Running")
        apply(cluster, namespace, queued_job("waiting", queue))
        wait_until(lambda: job(cluster, namespace, "waiting").get("status", {}).get("reason")
                   == "Queued", 30, "the second job queued")  # fmt: skip
        patch = '{"spec": {"runPolicy": {"suspend": true}}}'
        cluster.kubectl("patch", "tj", "paused", "-n", namespace, "--type=merge", "-p", patch)
        wait_for_phase(cluster, namespace, "paused", "Suspended")
        # Deactivated, evicted by Kueue (InactiveWorkload), quota given back: the other runs.
        wait_for_phase(cluster, namespace, "waiting", "Running", timeout=60)
        assert workload_of(cluster, namespace, "paused")["spec"]["active"] is False
        patch = '{"spec": {"runPolicy": {"suspend": false}}}'
        cluster.kubectl("patch", "tj", "paused", "-n", namespace, "--type=merge", "-p", patch)
        resumed = wait_until(lambda: (b := job(cluster, namespace, "paused"))["status"].get(
            "reason") == "Queued" and b, 30, "the resumed job queued again")  # fmt: skip
        assert resumed["status"]["phase"] == "Pending"
        assert workload_of(cluster, namespace, "paused")["spec"]["active"] is True
