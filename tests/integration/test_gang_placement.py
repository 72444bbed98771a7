"""Gang placement end to end: pods behind the gate, released together where the engine says.

Each test gets a private pool of simulated H100 nodes (node_pools.py) so it
can fragment or fill it exactly; kube-scheduler does the binding.
"""

from __future__ import annotations

import json
import time

import pytest

from integration.node_pools import blocker_pod, node_pool
from integration.pod_webhook import mutating_pod_webhook
from integration.trainwave_fixtures import (
    apply,
    condition,
    dry_runs,
    events_about,
    job,
    job_manifest,
    nothing_waits,
    placed_at_creation,
    wait_for_phase,
    wait_until,
    worker_pods,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

GATE = "trainwave.io/placement"


def pool_job(name, pool, *, workers, gpus, run_for="60s", placement=None, **spec):
    manifest = job_manifest(
        name, workers=workers, gpus=gpus, run_for=run_for,
        template_spec={"nodeSelector": pool.selector}, **spec,
    )  # fmt: skip
    if placement:
        manifest["spec"]["placement"] = placement
    return manifest


def by_rank(pods):
    return sorted(pods, key=lambda p: int(p["metadata"]["labels"]["trainwave.io/rank"]))


def gated(pod) -> bool:
    return any(g["name"] == GATE for g in pod["spec"].get("schedulingGates") or [])


def scheduled(cluster, namespace, name):
    found = condition(job(cluster, namespace, name), "Scheduled")
    return found or {}


def test_a_gang_lands_on_the_nodes_the_engine_chose_in_one_rack(
    cluster, namespace, running_operator
):
    with node_pool(cluster, rack_sizes=(4, 4)) as pool:
        rack_a, rack_b = pool.racks.values()
        # Fragment rack A: 2 GPUs taken on each node, 6 left; rack B is empty.
        apply(cluster, namespace, *(blocker_pod(f"hold-{i}", n, 2) for i, n in enumerate(rack_a)))
        apply(cluster, namespace, pool_job("whole", pool, workers=4, gpus=8))
        body = wait_for_phase(cluster, namespace, "whole", "Running")
        pods = by_rank(worker_pods(cluster, namespace, "whole"))
        nodes = [p["spec"]["nodeName"] for p in pods]
        assert nodes == rack_b, "full nodes only exist in rack B; ranks follow node order"
        assert [p["metadata"]["annotations"]["trainwave.io/node"] for p in pods] == nodes
        assert body["status"]["placement"]["nodes"] == nodes
        assert "1 rack" in body["status"]["placement"]["summary"]
        assert not any(gated(p) for p in pods)

        # Workers of 6 GPUs fit the holes of rack A exactly (best fit), not rack B.
        apply(cluster, namespace, pool_job("holes", pool, workers=4, gpus=6))
        wait_for_phase(cluster, namespace, "holes", "Running")
        holes = [p["spec"]["nodeName"] for p in by_rank(worker_pods(cluster, namespace, "holes"))]
        assert holes == rack_a


def fragment_both_racks(cluster, namespace, pool):
    """One node of each 2-node rack full: a 2-worker gang fits only spread over both."""
    rack_a, rack_b = pool.racks.values()
    apply(
        cluster, namespace, blocker_pod("hold-a", rack_a[0], 8), blocker_pod("hold-b", rack_b[0], 8)
    )
    return rack_a, rack_b


def test_a_gang_waits_for_one_rack_before_spreading_and_takes_it_when_it_frees(
    cluster, namespace, running_operator
):
    with node_pool(cluster, rack_sizes=(2, 2)) as pool:
        _, rack_b = fragment_both_racks(cluster, namespace, pool)
        wait = {"preferredLevelWaitSeconds": 300}
        apply(cluster, namespace, pool_job("patient", pool, workers=2, gpus=8, placement=wait))
        why = wait_until(
            lambda: scheduled(cluster, namespace, "patient").get("reason")
            == "WaitingForPreferredLevel" and scheduled(cluster, namespace, "patient"),
            30, "the gang to wait for one rack",
        )  # fmt: skip
        assert "no rack has room for 2 workers" in why["message"], why["message"]
        assert all(gated(p) for p in worker_pods(cluster, namespace, "patient"))
        cluster.kubectl("delete", "pod", "hold-b", "-n", namespace, "--wait=true", timeout=90)
        body = wait_for_phase(cluster, namespace, "patient", "Running", timeout=60)
        nodes = [p["spec"]["nodeName"] for p in worker_pods(cluster, namespace, "patient")]
        assert sorted(nodes) == sorted(rack_b)
        assert "1 rack" in body["status"]["placement"]["summary"]


def test_a_gang_waiting_for_one_rack_spreads_at_once_when_a_gang_queues_behind_it(
    cluster, namespace, running_operator
):
    """Rule 8b: in a saturated cluster the wait would idle the room the queue waits for."""
    with node_pool(cluster, rack_sizes=(2, 2)) as pool:
        fragment_both_racks(cluster, namespace, pool)
        wait = {"preferredLevelWaitSeconds": 300}
        apply(cluster, namespace, pool_job("patient", pool, workers=2, gpus=8, placement=wait))
        wait_until(
            lambda: scheduled(cluster, namespace, "patient").get("reason")
            == "WaitingForPreferredLevel",
            30, "the gang to wait for one rack",
        )  # fmt: skip
        # Arrival is the creation time, 1 s resolution; within one second the queue orders
        # by name, and "behind" would come first.
        time.sleep(1.1)
        apply(cluster, namespace, pool_job("behind", pool, workers=2, gpus=8, placement=wait))
        body = wait_for_phase(cluster, namespace, "patient", "Running", timeout=60)
        summary = body["status"]["placement"]["summary"]
        assert "2 racks" in summary, summary
        assert all(gated(p) for p in worker_pods(cluster, namespace, "behind"))


def test_time_spent_waiting_for_any_room_does_not_use_up_the_wait_for_one_rack(
    cluster, namespace, running_operator
):
    """As slurmctld's wait4switch_start: the clock starts when a rack was all it lacked."""
    with node_pool(cluster, rack_sizes=(2, 2)) as pool:
        holds = [blocker_pod(f"hold-{i}", n, 8) for i, n in enumerate(pool.nodes)]
        apply(cluster, namespace, *holds)
        wait = {"preferredLevelWaitSeconds": 8}
        apply(cluster, namespace, pool_job("late", pool, workers=2, gpus=8, placement=wait))
        full = wait_until(
            lambda: scheduled(cluster, namespace, "late").get("reason") not in (None, "Placing")
            and scheduled(cluster, namespace, "late"),
            30, "the gang to wait for room",
        )  # fmt: skip
        assert full["reason"] != "WaitingForPreferredLevel", full
        time.sleep(10)  # longer than its wait, with no room anywhere
        rack_a, rack_b = pool.racks.values()
        for node in (rack_a[1], rack_b[1]):  # room for the gang, but only spread
            index = pool.nodes.index(node)
            cluster.kubectl("delete", "pod", f"hold-{index}", "-n", namespace, "--wait=true",
                            timeout=90)  # fmt: skip
        wait_until(
            lambda: scheduled(cluster, namespace, "late").get("reason")
            == "WaitingForPreferredLevel",
            30, "the gang to wait for one rack now that only a spread fits",
        )  # fmt: skip
        body = wait_for_phase(cluster, namespace, "late", "Running", timeout=60)
        summary = body["status"]["placement"]["summary"]
        assert "2 racks" in summary, summary


def test_a_gang_with_no_wait_spreads_at_once_and_says_why(cluster, namespace, running_operator):
    with node_pool(cluster, rack_sizes=(2, 2)) as pool:
        fragment_both_racks(cluster, namespace, pool)
        hasty = {"preferredLevelWaitSeconds": 0}
        apply(cluster, namespace, pool_job("hasty", pool, workers=2, gpus=8, placement=hasty))
        body = wait_for_phase(cluster, namespace, "hasty", "Running", timeout=60)
        summary = body["status"]["placement"]["summary"]
        assert "2 racks" in summary, summary
        assert "no rack had room for 2 workers (roomiest: " in summary, summary


def test_tensor_parallel_pairs_share_a_node(cluster, namespace, running_operator):
    with node_pool(cluster, rack_sizes=(2, 2)) as pool:
        manifest = pool_job("tp", pool, workers=8, gpus=4, placement={"parallelism": {"tensor": 8}})
        apply(cluster, namespace, manifest)
        wait_for_phase(cluster, namespace, "tp", "Running")
        nodes = [p["spec"]["nodeName"] for p in by_rank(worker_pods(cluster, namespace, "tp"))]
        pairs = [nodes[i : i + 2] for i in range(0, 8, 2)]
        assert all(a == b for a, b in pairs), f"each tensor group (2 workers) on one node: {nodes}"
        assert len(set(nodes)) == 4


def test_a_gang_waits_whole_with_the_reason_and_starts_when_room_frees(
    cluster, namespace, running_operator
):
    with node_pool(cluster, rack_sizes=(2, 2)) as pool:
        apply(cluster, namespace, pool_job("first", pool, workers=4, gpus=8, run_for="12s"))
        wait_for_phase(cluster, namespace, "first", "Running")
        apply(cluster, namespace, pool_job("second", pool, workers=2, gpus=8))
        why = wait_until(
            lambda: scheduled(cluster, namespace, "second").get("reason") == "NotEnoughGPUs"
            and scheduled(cluster, namespace, "second"),
            30, "second to wait for GPUs",
        )  # fmt: skip
        assert why["status"] == "False"
        assert "needs 16 GPUs" in why["message"], why["message"]
        pods = worker_pods(cluster, namespace, "second")
        assert len(pods) == 2
        assert all(gated(p) for p in pods), "the whole gang waits gated"
        assert not any(p["spec"].get("nodeName") for p in pods), "no worker holds a node"
        status = job(cluster, namespace, "second")["status"]
        assert status["phase"] == "Scheduling"

        wait_for_phase(cluster, namespace, "first", "Succeeded", timeout=60)
        body = wait_for_phase(cluster, namespace, "second", "Running", timeout=60)
        assert condition(body, "Scheduled")["status"] == "True"


def test_two_gangs_that_fit_only_one_at_a_time_never_both_start(
    cluster, namespace, running_operator
):
    with node_pool(cluster, rack_sizes=(3,)) as pool:
        # Two gangs of 2 x 8 on 3 nodes: with per-pod scheduling each could get
        # one node and both would hang half-placed. Exactly one starts.
        apply(
            cluster, namespace,
            pool_job("left", pool, workers=2, gpus=8, run_for="6s"),
            pool_job("right", pool, workers=2, gpus=8, run_for="6s"),
        )  # fmt: skip
        seen_half = []
        half_before: set[str] = set()

        def one_running():
            phases = {
                n: job(cluster, namespace, n).get("status", {}).get("phase")
                for n in ("left", "right")
            }
            half_now = set()
            for name in ("left", "right"):
                bound = [
                    p for p in worker_pods(cluster, namespace, name) if p["spec"].get("nodeName")
                ]
                if len(bound) == 1:
                    half_now.add(name)
            # kube-scheduler binds a released gang's pods one by one, so one poll may land
            # between two binds; a gang holding one node alone stays so poll after poll.
            seen_half.extend(sorted(half_now & half_before))
            half_before.clear()
            half_before.update(half_now)
            return list(phases.values()).count("Running") == 1 and phases

        phases = wait_until(one_running, 60, "one gang running")
        waiting = next(n for n, p in phases.items() if p != "Running")
        assert phases[waiting] == "Scheduling"
        for name in ("left", "right"):
            wait_for_phase(cluster, namespace, name, "Succeeded", timeout=90)
        assert not seen_half, f"a gang was seen half bound: {seen_half}"


@pytest.mark.parametrize(
    "case",
    [
        (5, None, "NeverFits", "needs 40 GPUs"),
        (3, {"requiredLevel": "rack"}, "NeverFits", "rack"),
    ],
    ids=["more-than-the-pool", "larger-than-any-required-rack"],
)
def test_a_gang_that_can_never_fit_says_why(cluster, namespace, running_operator, case):
    workers, placement, reason, words = case
    with node_pool(cluster, rack_sizes=(2, 2)) as pool:
        # Only the pool's 4 nodes match; with requiredLevel rack only 2 nodes do.
        apply(
            cluster, namespace, pool_job("big", pool, workers=workers, gpus=8, placement=placement)
        )
        why = wait_until(
            lambda: scheduled(cluster, namespace, "big").get("reason") == reason
            and scheduled(cluster, namespace, "big"),
            30, f"Scheduled=False {reason}",
        )  # fmt: skip
        assert words in why["message"], why["message"]
        assert all(gated(p) for p in worker_pods(cluster, namespace, "big"))


def test_an_unknown_level_fails_the_job_naming_the_levels(cluster, namespace, running_operator):
    with node_pool(cluster, rack_sizes=(1,)) as pool:
        apply(
            cluster,
            namespace,
            pool_job("lost", pool, workers=1, gpus=8, placement={"requiredLevel": "row"}),
        )
        body = wait_for_phase(cluster, namespace, "lost", "Failed", timeout=30)
        assert body["status"]["reason"] == "InvalidSpec"
        assert "spec.placement" in body["status"]["message"]
        assert "rack" in body["status"]["message"], "the message lists the known levels"


def unbindable_job(name, pool, *, bind_timeout):
    """One worker of 8 GPUs that must sit next to a pod that does not exist: the placer
    (which mirrors kube-scheduler's node filters, not inter-pod affinity) places it, and
    kube-scheduler can never bind it."""
    manifest = pool_job(
        name, pool, workers=1, gpus=8, placement={"bindTimeoutSeconds": bind_timeout}
    )
    manifest["spec"]["template"]["spec"]["affinity"] = {
        "podAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {"matchLabels": {"test.trainwave.io/absent": "x"}},
                    "topologyKey": "kubernetes.io/hostname",
                }
            ]
        }
    }
    return manifest


def test_a_gang_that_does_not_bind_is_replanned(cluster, namespace, running_operator):
    with node_pool(cluster, rack_sizes=(1,)) as pool:
        # After the bind timeout the operator gives the room back and plans the gang
        # again, uncounted.
        apply(cluster, namespace, unbindable_job("greedy", pool, bind_timeout=5))
        body = wait_until(
            lambda: (b := job(cluster, namespace, "greedy")).get("status", {}).get("attempt", 0) >= 1 and b,
            40, "a re-planned attempt",
        )  # fmt: skip
        assert body["status"]["restarts"] == 0
        events = events_about(cluster, namespace, lambda e: e.get("reason") == "BindTimeout",
                              "a BindTimeout Event")  # fmt: skip
        notes = [e.get("note", "") for e in events]
        assert "not bound 5s after placement" in notes[0]


def test_a_worker_kube_scheduler_cannot_bind_is_named_with_its_reason(
    cluster, namespace, running_operator
):
    """Before its bind timeout, the job waiting in Scheduling says why: kube-scheduler's
    PodScheduled=False reason and message, as `kubectl describe pod` shows them."""
    with node_pool(cluster, rack_sizes=(1,)) as pool:
        apply(cluster, namespace, unbindable_job("unbindable", pool, bind_timeout=120))
        status = wait_until(
            lambda: (s := job(cluster, namespace, "unbindable").get("status") or {})
            and "not scheduled" in s.get("message", "") and s,
            40, "kube-scheduler's reason on the job",
        )  # fmt: skip
        assert status["phase"] == "Scheduling", status
        pod = worker_pods(cluster, namespace, "unbindable")[0]["metadata"]["name"]
        assert status["message"].startswith(
            f"0/1 workers bound to nodes; worker 0 ({pod}): not scheduled: Unschedulable: 0/"
        ), status["message"]
        assert "affinity" in status["message"], status["message"]
        scheduled = next(c for c in status["conditions"] if c["type"] == "Scheduled")
        assert scheduled["message"] == status["message"], scheduled


def test_a_gang_with_room_is_created_placed_unless_a_limit_range_may_change_its_pods(
    cluster, namespace, running_operator
):
    wait_until(lambda: nothing_waits(cluster), 120, "no gang waiting anywhere")
    with node_pool(cluster, rack_sizes=(2,)) as pool:
        before = placed_at_creation(running_operator)
        apply(cluster, namespace, pool_job("direct", pool, workers=2, gpus=8))
        wait_for_phase(cluster, namespace, "direct", "Running")
        pods = worker_pods(cluster, namespace, "direct")
        assert placed_at_creation(running_operator) == before + 1, "one write each"
        assert sorted(p["spec"]["nodeName"] for p in pods) == sorted(pool.nodes)
        for pod in pods:
            assert pod["metadata"]["annotations"]["trainwave.io/node"] == pod["spec"]["nodeName"]
        # Its first status was held until the pods' events came: the news of the phases on
        # the way (job accepted, 0/2 bound) is posted with it only if it still said
        # Scheduling, never one without the other.
        # Events are posted in order, so those before the Running one are there with it.
        events_about(cluster, namespace, lambda e: e["regarding"]["name"] == "direct"
                     and e["reason"] == "AllWorkersRunning", "the Running Event")  # fmt: skip
        reasons = {e["reason"] for e in events_about(
            cluster, namespace, lambda e: e["regarding"]["name"] == "direct", "its Events")}  # fmt: skip
        assert ("Created" in reasons) == ("WaitingForNodes" in reasons), reasons
        cluster.kubectl("delete", "trainingjob", "direct", "-n", namespace, "--wait=true")
        wait_until(lambda: not worker_pods(cluster, namespace, "direct"), 60, "the pods gone")

        # LimitRanger may add requests on the way in: the stored pods are placed, behind
        # the gate, as before.
        limits = {"apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": "defaults"},
                  "spec": {"limits": [{"type": "Container", "defaultRequest": {"cpu": "100m"}}]}}  # fmt: skip
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(limits))
        time.sleep(2)  # the operator's LimitRange watch
        before = placed_at_creation(running_operator)
        apply(cluster, namespace, pool_job("gated", pool, workers=2, gpus=8))
        wait_for_phase(cluster, namespace, "gated", "Running")
        pods = worker_pods(cluster, namespace, "gated")
        assert placed_at_creation(running_operator) == before, "created gated, then released"
        assert all(c["resources"]["requests"]["cpu"] == "100m"
                   for p in pods for c in p["spec"]["containers"])  # fmt: skip


SPOT = {"key": "example.com/spot", "operator": "Exists", "effect": "NoSchedule"}


def test_past_a_pod_webhook_only_a_gang_it_would_change_is_created_behind_the_gate(
    cluster, namespace, running_operator
):
    """A mutating webhook matching pod CREATE: the first placed pod of each gang is created
    as a dry run first. The webhook changes one job's pods (a toleration added): that gang
    is created gated and placed from its stored pods; it leaves the other job's pods alone
    (its object selector): that gang is created placed."""
    wait_until(lambda: nothing_waits(cluster), 120, "no gang waiting anywhere")
    with (
        node_pool(cluster, rack_sizes=(2,)) as pool,
        mutating_pod_webhook(cluster, {"trainwave.io/job-name": "tolerated"}, SPOT) as reviewed,
    ):
        time.sleep(2)  # the operator's watch of webhook configurations
        placed, changed, unchanged = (placed_at_creation(running_operator),
                                      dry_runs(running_operator, "changed"),
                                      dry_runs(running_operator, "unchanged"))  # fmt: skip
        apply(cluster, namespace, pool_job("tolerated", pool, workers=2, gpus=8))
        wait_for_phase(cluster, namespace, "tolerated", "Running")
        pods = worker_pods(cluster, namespace, "tolerated")
        assert all(SPOT in p["spec"]["tolerations"] for p in pods), "the webhook ran"
        assert placed_at_creation(running_operator) == placed, "created gated, then released"
        assert dry_runs(running_operator, "changed") == changed + 1
        assert reviewed == [True, False, False], "one dry run, then the two creates"
        cluster.kubectl("delete", "trainingjob", "tolerated", "-n", namespace, "--wait=true")
        wait_until(lambda: not worker_pods(cluster, namespace, "tolerated"), 60, "the pods gone")

        apply(cluster, namespace, pool_job("untouched", pool, workers=2, gpus=8))
        wait_for_phase(cluster, namespace, "untouched", "Running")
        assert placed_at_creation(running_operator) == placed + 1, "one write each"
        assert dry_runs(running_operator, "unchanged") == unchanged + 1
        assert len(reviewed) == 3, "the webhook never saw the other job's pods"
