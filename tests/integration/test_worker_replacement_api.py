"""Replace one worker, not the gang (runPolicy.workerReplacement), on the real control plane.

Jobs with the runtime (in-place restarts on by default) on a private pool of kwok nodes:
rack 0 has four 8-GPU nodes, rack 1 one. The gang of two 8-GPU workers fits only rack 0,
leaving two of its nodes free. When worker 1's node goes NotReady (or is drained), only
worker 1 gets a new pod, of the same attempt and hostname, named with the replacement's
serial (`-r1`) and created while the old pod may still terminate, on a free node of rack 0, although
placement's objective alone (best fit) would take rack 1's single node; worker 0 keeps
its pod (same UID). Worker 0, which hosts the rendezvous store, is replaced alone the same
way. No training runs here (kwok plays the pods); the healthy workers re-entering torch's
rendezvous (for worker 0, their agents started again by their launchers) is the runtime's
part, shown on the real nodes and by tests/host/runtime/launcher.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from cluster.controlplane import Cluster
from integration.node_pools import Pool, node_pool
from integration.test_disruptions import make_not_ready
from integration.trainwave_fixtures import (
    apply,
    events_about,
    job,
    job_manifest,
    wait_for_phase,
    wait_until,
    worker_pods,
)
from trainwave import contract

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

POLICY: dict[str, Any] = {"failurePolicy": {"maxRestarts": 0, "nodeNotReadySeconds": 3}}


def replaced_counter(operator: Any) -> float:
    pattern = r'^trainwave_workers_replaced_total\{cause="disruption"\} (\S+)$'
    found = re.search(pattern, operator.metrics(), re.M)
    return float(found.group(1)) if found else 0.0


def start(cluster: Cluster, namespace: str, name: str, pool: Pool) -> dict[int, dict[str, Any]]:
    """The job Running on rack 0; its pods by rank."""
    manifest = job_manifest(
        name, workers=2, gpus=8, result=None, run_policy=POLICY, runtime={},
        template_spec={"nodeSelector": pool.selector},
    )  # fmt: skip
    apply(cluster, namespace, manifest)
    wait_for_phase(cluster, namespace, name, "Running", timeout=90)
    pods = by_rank(worker_pods(cluster, namespace, name))
    rack0 = next(iter(pool.racks))
    assert {pool.rack_of(p["spec"]["nodeName"]) for p in pods.values()} == {rack0}
    return pods


def by_rank(pods: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    return {
        int(p["metadata"]["labels"][contract.LABEL_RANK]): p
        for p in pods if not p["metadata"].get("deletionTimestamp")
    }  # fmt: skip


def replaced(
    cluster: Cluster, namespace: str, name: str, old_uid: str, rank: int = 1
) -> dict[str, Any]:
    """Worker `rank`'s new pod once it runs, and the job's status says the replacement ended."""

    def check() -> dict[str, Any] | None:
        status = job(cluster, namespace, name).get("status", {})
        pods = by_rank(worker_pods(cluster, namespace, name))
        new = pods.get(rank)
        replacements = status.get("replacements") or {"pending": ["none yet"]}
        done = status.get("phase") == "Running" and not replacements.get("pending")
        if new and new["metadata"]["uid"] != old_uid and new["status"].get("phase") == "Running":
            return new if done else None
        return None

    found: dict[str, Any] = wait_until(check, 120, f"worker {rank} replaced and running")
    return found


def assert_replaced_alone(
    cluster: Cluster, namespace: str, name: str, pool: Pool, *,
    before: dict[int, dict[str, Any]], operator: Any, counted_before: float, rank: int = 1,
) -> dict[str, Any]:  # fmt: skip
    kept = 1 - rank
    old_node = before[rank]["spec"]["nodeName"]
    new = replaced(cluster, namespace, name, before[rank]["metadata"]["uid"], rank)
    now = by_rank(worker_pods(cluster, namespace, name))
    assert now[kept]["metadata"]["uid"] == before[kept]["metadata"]["uid"]  # the other stayed
    # Same attempt, rank and hostname (so the same DNS name); a name of its own.
    assert new["metadata"]["name"] == before[rank]["metadata"]["name"] + "-r1"
    assert new["spec"]["hostname"] == before[rank]["spec"]["hostname"]
    assert new["metadata"]["labels"][contract.LABEL_RANK] == str(rank)
    new_node = new["spec"]["nodeName"]
    assert new_node != old_node
    assert pool.rack_of(new_node) == pool.rack_of(old_node)  # the gang's rack, not rack 1
    status = job(cluster, namespace, name)["status"]
    assert (status["attempt"], status["restarts"], status["disruptions"]) == (0, 0, 1)
    assert (status["replacements"]["total"], status["replacements"]["inAttempt"]) == (1, 1)
    events = events_about(
        cluster, namespace,
        lambda e: e.get("reason") == "WorkerReplaced"
        and e.get("regarding", {}).get("name") == name,
        "the WorkerReplaced Event",
    )  # fmt: skip
    assert f"worker {rank} replaced: node {old_node} -> {new_node}" in events[0]["note"]
    assert events[0]["type"] == "Warning"
    assert replaced_counter(operator) == counted_before + 1
    return status


def test_a_not_ready_node_replaces_only_its_worker_in_the_same_rack(
    cluster, namespace, running_operator
):
    with node_pool(cluster, rack_sizes=(4, 1)) as pool:
        counted = replaced_counter(running_operator)
        before = start(cluster, namespace, "lonely", pool)
        sick = before[1]["spec"]["nodeName"]
        make_not_ready(cluster, sick)
        assert_replaced_alone(
            cluster,
            namespace,
            "lonely",
            pool,
            before=before,
            operator=running_operator,
            counted_before=counted,
        )
        replacing = events_about(
            cluster, namespace,
            lambda e: e.get("reason") == "ReplacingWorker"
            and e.get("regarding", {}).get("name") == "lonely",
            "the ReplacingWorker Event",
        )  # fmt: skip
        assert f"lost its node {sick} (NodeNotReady)" in replacing[0]["note"]
        assert "the other workers (0) keep their pods" in replacing[0]["note"]


def test_a_drained_node_replaces_only_its_worker(cluster, namespace, running_operator):
    with node_pool(cluster, rack_sizes=(4, 1)) as pool:
        counted = replaced_counter(running_operator)
        before = start(cluster, namespace, "drained", pool)
        node = before[1]["spec"]["nodeName"]
        # What kubectl drain does: cordon, then evict through the Eviction API.
        cluster.kubectl("cordon", node)
        evict(cluster, namespace, before[1]["metadata"]["name"])
        assert_replaced_alone(
            cluster,
            namespace,
            "drained",
            pool,
            before=before,
            operator=running_operator,
            counted_before=counted,
        )


def test_the_replacement_runs_while_the_old_pod_is_still_terminating(
    cluster, namespace, running_operator
):
    # A finalizer keeps the evicted pod in the API, terminating, as a kubelet does for
    # its grace period; the replacement must not wait for its name.
    with node_pool(cluster, rack_sizes=(4, 1)) as pool:
        counted = replaced_counter(running_operator)
        before = start(cluster, namespace, "lingering", pool)
        victim = before[1]["metadata"]["name"]
        hold = {"metadata": {"finalizers": ["test.trainwave.io/hold"]}}
        cluster.kubectl("patch", "pod", victim, "-n", namespace, "--type", "merge",
                        "-p", json.dumps(hold))  # fmt: skip
        try:
            evict(cluster, namespace, victim)
            assert_replaced_alone(
                cluster,
                namespace,
                "lingering",
                pool,
                before=before,
                operator=running_operator,
                counted_before=counted,
            )
            old = cluster.kubectl("get", "pod", victim, "-n", namespace, "-o", "json").stdout
            assert json.loads(old)["metadata"].get("deletionTimestamp"), old
        finally:
            cluster.kubectl("patch", "pod", victim, "-n", namespace, "--type", "merge",
                            "-p", '{"metadata":{"finalizers":null}}')  # fmt: skip
        # Gone at last, it is no news: the gang runs on, nothing counted again.
        wait_until(lambda: not [p for p in worker_pods(cluster, namespace, "lingering")
                                if p["metadata"]["name"] == victim], 60, "the old pod gone")  # fmt: skip
        status = job(cluster, namespace, "lingering")["status"]
        assert (status["phase"], status["attempt"], status["disruptions"]) == ("Running", 0, 1)


def evict(cluster: Cluster, namespace: str, pod: str) -> None:
    """What kubectl drain does to each pod after the cordon: the Eviction API."""
    eviction = {"apiVersion": "policy/v1", "kind": "Eviction",
                "metadata": {"name": pod, "namespace": namespace}}  # fmt: skip
    cluster.kubectl("create", "--raw", f"/api/v1/namespaces/{namespace}/pods/{pod}/eviction",
                    "-f", "-", input=json.dumps(eviction))  # fmt: skip


def test_losing_worker_0_the_store_host_replaces_it_alone(cluster, namespace, running_operator):
    with node_pool(cluster, rack_sizes=(4, 1)) as pool:
        counted = replaced_counter(running_operator)
        before = start(cluster, namespace, "hostless", pool)
        make_not_ready(cluster, before[0]["spec"]["nodeName"])
        assert_replaced_alone(
            cluster,
            namespace,
            "hostless",
            pool,
            before=before,
            operator=running_operator,
            counted_before=counted,
            rank=0,
        )
