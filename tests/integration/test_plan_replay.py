"""`trainwave plan` and the operator's placer give the same answer, job after job.

A seeded stream mixes whole-GPU, shared-GPU, CPU-only, RDMA and zone-spread
(DoNotSchedule topologySpreadConstraints) jobs on two private pools (one of H100 nodes with InfiniBand, one node offering its GPUs for sharing).
Jobs arrive one at a time: before each is applied, `plan_on` answers for it on a
fresh listing of the cluster; then the operator places it (or says why it waits)
from its own view, and both answers must be the same node per rank (and GPU, for
shared workers) or the same reason code. A job that waits is deleted before the
next arrives, so the placer's queue holds nothing `plan` cannot see.
"""

from __future__ import annotations

import random

import pytest
from kubernetes import config

from integration.node_pools import H100, node_pool
from integration.trainwave_fixtures import apply, condition, job, job_manifest, wait_until
from integration.trainwave_fixtures import worker_pods as pods_of
from trainwave.controller.clusterview import listed_view
from trainwave.controller.kube import KubeClient
from trainwave.controller.planning import plan_on
from trainwave.placement.queueing import Wait
from trainwave.placement.sharing import SharedPlacement

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

IB_NODE = {"cpu": "64", "gpu": H100, "rdma": {"nics": 4, "linkLayer": "IB", "rateGbps": 400}}
SHARED_NODE = {"cpu": "32", "gpu": {**H100, "count": 2, "shared": True}}
JOBS = 14
ZONE = "topology.kubernetes.io/zone"


def zone_spread(name: str) -> list[dict]:
    selector = {"matchLabels": {"trainwave.io/job-name": name}}
    return [{"maxSkew": 1, "topologyKey": ZONE, "whenUnsatisfiable": "DoNotSchedule",
             "labelSelector": selector}]  # fmt: skip


def stream(seed: int, whole, shared) -> list[dict]:
    rng = random.Random(seed)
    jobs = []
    for index in range(JOBS):
        kind = rng.choice(["whole", "whole", "shared", "cpu", "rdma", "spread"])
        name = f"{kind}-{index}"
        pool = shared if kind == "shared" else whole
        gpus = {"whole": rng.choice([2, 4, 8]), "rdma": 8, "cpu": 0, "shared": 0, "spread": 2}[kind]
        workers = 1 if kind == "shared" else rng.choice([1, 2, 3])
        template = {"nodeSelector": pool.selector}
        if kind == "spread":
            template["topologySpreadConstraints"] = zone_spread(name)
        manifest = job_manifest(
            name, workers=workers, gpus=gpus, run_for="600s",
            template_spec=template,
            resources={"requests": {"cpu": str(rng.choice([4, 16, 24]))}},
        )  # fmt: skip
        if kind == "shared":
            manifest["spec"]["gpuSharing"] = {"memory": f"{rng.choice([20, 30, 50])}Gi"}
        if kind == "rdma":
            manifest["spec"]["network"] = {"rdma": {"linkLayer": "InfiniBand"}}
        jobs.append(manifest)
    return jobs


def operator_answer(cluster, namespace, name, workers):
    """The placer's decision: the node (and GPU) of each rank, or the Scheduled reason."""

    def decided():
        # The condition first: a waiting reason read before pods that are still all
        # gated is the placer's word on this gang, not a release in progress.
        scheduled = condition(job(cluster, namespace, name), "Scheduled") or {}
        pods = pods_of(cluster, namespace, name)
        if len(pods) < workers:
            return None
        if all(not p["spec"].get("schedulingGates") for p in pods):
            ranks = sorted(pods, key=lambda p: int(p["metadata"]["labels"]["trainwave.io/rank"]))
            notes = [p["metadata"]["annotations"] for p in ranks]
            return [(n.get("trainwave.io/node"), n.get("trainwave.io/gpu-uuid")) for n in notes]
        waiting = scheduled.get("status") == "False" and scheduled.get("reason") not in (
            None, "Placing", "WaitingForNodes",
        )  # fmt: skip
        if waiting and all(p["spec"].get("schedulingGates") for p in pods):
            return scheduled["reason"]
        return None

    return wait_until(decided, 60, f"the placer's decision on {name}")


def plan_answer(result):
    if isinstance(result, Wait):
        return result.code
    if isinstance(result, SharedPlacement):
        return [(p.node, p.gpu_uuid) for p in result.pins]
    return [(node, None) for node in result.nodes]


def test_plan_and_the_placer_agree_on_a_mixed_stream(cluster, namespace, running_operator):
    kube = KubeClient(config.new_client_from_config(str(cluster.kubeconfig)))
    with (
        node_pool(cluster, rack_sizes=(2, 2), shape=IB_NODE) as whole,
        node_pool(cluster, rack_sizes=(1,), shape=SHARED_NODE) as shared,
    ):
        # One rack per zone: a spread job's workers leave the rack the objective prefers.
        for zone, nodes in zip(("a", "b"), whole.racks.values(), strict=True):
            cluster.kubectl("label", "nodes", *nodes, f"{ZONE}={zone}")
        agreed, waited, kinds = 0, 0, set()
        for manifest in stream(2026, whole, shared):
            name = manifest["metadata"]["name"]
            asked = {**manifest, "metadata": {**manifest["metadata"], "namespace": namespace}}
            planned = plan_answer(plan_on(asked, listed_view(kube)))
            apply(cluster, namespace, manifest)
            placed = operator_answer(cluster, namespace, name, manifest["spec"]["workers"])
            assert placed == planned, f"{name}: placer {placed}, plan {planned}"
            agreed += 1
            kinds.add(name.split("-")[0])
            if isinstance(placed, str):  # waiting: leave the queue empty for the next one
                waited += 1
                cluster.kubectl("delete", "trainingjob", name, "-n", namespace, "--wait=true")
        assert agreed == JOBS
        assert 0 < waited < JOBS, "the stream fills the pools: some jobs place, some wait"
        assert kinds == {"whole", "shared", "cpu", "rdma", "spread"}, "the stream covers every kind"
