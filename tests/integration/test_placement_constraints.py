"""Placement decides with kube-scheduler's feasibility for the worker's actual pod (issue 9).

Each test gets a private pool (node_pools.py) and makes some of its nodes wrong for
the worker in one way the GPU count cannot see: a taint, a label, too little CPU,
memory or an extended resource, cordoned, NotReady, a foreign pod. The gang must go
to the right nodes at the first try: `status.attempt` stays 0 and no BindTimeout.
"""

from __future__ import annotations

import json

import pytest

from cluster.topology import KWOK_NODE_ANNOTATION, KWOK_NODE_TYPE_LABEL, NodeShape, build_node
from integration.node_pools import H100, POOL_LABEL, blocker_pod, node_pool
from integration.trainwave_fixtures import (
    apply,
    condition,
    get_json,
    job,
    job_manifest,
    wait_for_phase,
    wait_until,
    worker_pods,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

GATE = "trainwave.io/placement"
HALF = "test.trainwave.io/half"
DONGLE = "example.com/dongle"
TOLERATE_VISION = {"key": "team", "operator": "Equal", "value": "vision", "effect": "NoSchedule"}


def pool_job(name, pool, *, workers, gpus, run_for="60s", template=None, **spec):
    template_spec = dict(template or {})
    template_spec["nodeSelector"] = pool.selector | template_spec.get("nodeSelector", {})
    return job_manifest(
        name, workers=workers, gpus=gpus, run_for=run_for, template_spec=template_spec, **spec
    )


def nodes_in_rank_order(cluster, namespace, name):
    pods = worker_pods(cluster, namespace, name)
    pods.sort(key=lambda p: int(p["metadata"]["labels"]["trainwave.io/rank"]))
    return [p["spec"].get("nodeName") for p in pods]


def gated(pod) -> bool:
    return any(g["name"] == GATE for g in pod["spec"].get("schedulingGates") or [])


def runs_first_try(cluster, namespace, name):
    """Running, never re-planned, and the nodes its ranks were bound to."""
    body = wait_for_phase(cluster, namespace, name, "Running", timeout=60)
    assert body["status"].get("attempt", 0) == 0, body["status"]
    reasons = [c.get("reason") for c in body["status"].get("conditions", [])]
    events = get_json(cluster, namespace, "events.events.k8s.io")["items"]
    reasons += [e.get("reason") for e in events]
    assert "BindTimeout" not in reasons, reasons
    return nodes_in_rank_order(cluster, namespace, name)


def waits_with(cluster, namespace, name, words, reasons=None):
    """Scheduled=False with `words` in the message (and one of `reasons`), every pod gated."""

    def scheduled():
        found = condition(job(cluster, namespace, name), "Scheduled") or {}
        fits = found.get("status") == "False" and words in found.get("message", "")
        return fits and (reasons is None or found.get("reason") in reasons) and found

    try:
        why = wait_until(scheduled, 30, f"{name}: Scheduled=False saying {words!r}")
    except AssertionError:
        found = condition(job(cluster, namespace, name), "Scheduled")
        raise AssertionError(f"{name} never waited saying {words!r}: {found}") from None
    pods = worker_pods(cluster, namespace, name)
    assert pods
    assert all(gated(p) and not p["spec"].get("nodeName") for p in pods)
    return why


def test_a_taint_is_honoured_and_named(cluster, namespace, running_operator):
    with node_pool(cluster, rack_sizes=(2, 2)) as pool:
        vision, plain = pool.racks.values()
        cluster.kubectl("taint", "nodes", *vision, "team=vision:NoSchedule")
        # Rack order puts the tainted rack first: only the taint keeps the plain job off it.
        apply(cluster, namespace, pool_job("plain", pool, workers=2, gpus=8))
        assert runs_first_try(cluster, namespace, "plain") == plain
        tolerant = pool_job(
            "tolerant", pool, workers=2, gpus=8, template={"tolerations": [TOLERATE_VISION]}
        )
        apply(cluster, namespace, tolerant)
        assert runs_first_try(cluster, namespace, "tolerant") == vision
        apply(cluster, namespace, pool_job("blocked", pool, workers=1, gpus=8))
        waits_with(cluster, namespace, "blocked", "untolerated taint {team: vision}")


def affinity(operator, values):
    expression = {"key": HALF, "operator": operator, "values": values}
    terms = [{"matchExpressions": [expression]}]
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": terms}}}  # fmt: skip


@pytest.mark.parametrize(
    "template",
    [
        {"nodeSelector": {HALF: "b"}},
        {"affinity": affinity("In", ["b"])},
        {"affinity": affinity("NotIn", ["a"])},
    ],
    ids=["node-selector", "affinity-in", "affinity-not-in"],
)
def test_selectors_and_required_affinity_are_honoured(
    cluster, namespace, running_operator, template
):
    with node_pool(cluster, rack_sizes=(4,)) as pool:
        cluster.kubectl("label", "nodes", *pool.nodes[:2], f"{HALF}=a")
        cluster.kubectl("label", "nodes", *pool.nodes[2:], f"{HALF}=b")
        apply(cluster, namespace, pool_job("half", pool, workers=2, gpus=8, template=template))
        assert runs_first_try(cluster, namespace, "half") == pool.nodes[2:]


@pytest.mark.parametrize(
    ("template", "words"),
    [
        ({"nodeSelector": {HALF: "c"}}, "not matching half=c"),
        ({"affinity": affinity("In", ["c"])}, "required node affinity"),
    ],
    ids=["node-selector", "affinity"],
)
def test_an_impossible_selector_waits_naming_it(
    cluster, namespace, running_operator, template, words
):
    with node_pool(cluster, rack_sizes=(2,)) as pool:
        cluster.kubectl("label", "nodes", *pool.nodes, f"{HALF}=a")
        apply(cluster, namespace, pool_job("nowhere", pool, workers=1, gpus=8, template=template))
        why = waits_with(
            cluster, namespace, "nowhere", words, reasons=("NeverFits", "NoMatchingNodes")
        )
        assert job(cluster, namespace, "nowhere")["status"]["phase"] == "Scheduling", why


SHORTFALLS = {
    # resource: (what the blocker holds on the first node, what the worker asks)
    "cpu": ("48", "32"),
    "memory": ("400Gi", "256Gi"),
    DONGLE: ("1", "1"),
}


@pytest.mark.parametrize("resource", list(SHORTFALLS), ids=["cpu", "memory", "extended"])
def test_a_node_short_of_another_resource_is_avoided_first_try(
    cluster, namespace, running_operator, resource
):
    held, asked = SHORTFALLS[resource]
    shape = {"cpu": "64", "memory": "512Gi", "gpu": H100}
    with node_pool(cluster, rack_sizes=(2,), shape=shape) as pool:
        short, roomy = pool.nodes
        if resource == DONGLE:
            extra = {"capacity": {DONGLE: "1"}, "allocatable": {DONGLE: "1"}}
            for node in pool.nodes:
                patch = json.dumps({"status": extra})
                cluster.kubectl("patch", "node", node, "--subresource=status", "--type=merge",
                                "-p", patch)  # fmt: skip
        # The short node keeps 4 GPUs free: by GPUs alone it is the best fit for the worker.
        apply(cluster, namespace, blocker_pod("hog", short, 4, {resource: held}))
        asks = {"requests": {resource: asked}}
        if resource == DONGLE:
            asks["limits"] = {resource: asked}
        apply(cluster, namespace, pool_job("w", pool, workers=1, gpus=4, resources=asks))
        assert runs_first_try(cluster, namespace, "w") == [roomy]


def not_ready_node(pool, rack: str, position: int) -> dict:
    """A pool node no kwok manages, created NotReady and left that way."""
    name = f"{pool.name}-notready"
    shape = NodeShape.model_validate({"cpu": "192", "gpu": H100})
    node = build_node(
        pool.name, name, spine=f"{pool.name}-spine", rack=rack, position=position, shape=shape
    )
    node["metadata"]["annotations"].pop(KWOK_NODE_ANNOTATION)
    node["metadata"]["labels"].pop(KWOK_NODE_TYPE_LABEL)
    node["metadata"]["labels"][POOL_LABEL] = pool.name
    ready = {"type": "Ready", "status": "False", "reason": "KubeletNotReady", "message": "test"}
    node["status"]["conditions"] = [ready]
    return node


def test_cordoned_and_not_ready_nodes_are_skipped(cluster, namespace, running_operator):
    with node_pool(cluster, rack_sizes=(3,)) as pool:
        (rack,) = pool.racks
        cordoned, *good = pool.nodes
        cluster.kubectl("cordon", cordoned)
        cluster.kubectl("create", "-f", "-", input=json.dumps(not_ready_node(pool, rack, 3)))
        apply(cluster, namespace, pool_job("gang", pool, workers=2, gpus=8))
        assert runs_first_try(cluster, namespace, "gang") == good
        # A third worker has nowhere to go, and the message says why for each node.
        apply(cluster, namespace, pool_job("more", pool, workers=1, gpus=8))
        why = waits_with(cluster, namespace, "more", " cordoned")
        assert " not Ready" in why["message"], why["message"]


def test_a_foreign_pod_placed_by_kube_scheduler_counts(cluster, namespace, running_operator):
    with node_pool(cluster, rack_sizes=(2,)) as pool:
        busy, free = pool.nodes
        # Not bound by name: kube-scheduler binds it, as it would any tenant's pod.
        foreign = blocker_pod("tenant", busy, 2, {"cpu": "180", "memory": "1Ti"})
        foreign["spec"].pop("nodeName")
        foreign["spec"]["nodeSelector"] = {"kubernetes.io/hostname": busy}
        apply(cluster, namespace, foreign)
        wait_until(
            lambda: get_json(cluster, namespace, "pod", "tenant")["spec"].get("nodeName"),
            30, "the tenant pod bound",
        )  # fmt: skip
        # 6 GPUs are free on the busy node, an exact fit by GPUs; its CPU is not.
        asks = {"requests": {"cpu": "32", "memory": "64Gi"}}
        apply(cluster, namespace, pool_job("w", pool, workers=1, gpus=6, resources=asks))
        assert runs_first_try(cluster, namespace, "w") == [free]
