"""kube-scheduler's filters as mirrored by placement/filters.py, against the cases its docs list.

Taints and tolerations: https://kubernetes.io/docs/concepts/scheduling-eviction/taint-and-toleration/
Node affinity: https://kubernetes.io/docs/concepts/scheduling-eviction/assign-pod-node/
Resource requests (init containers, sidecars, overhead): component-helpers resource.PodRequests.
"""

from __future__ import annotations

from typing import Any

import pytest

from trainwave.placement.filters import check, describe, worker_slots
from trainwave.placement.requirements import (
    PodNeeds,
    Taint,
    Toleration,
    pod_needs,
    pod_requests,
    with_default_tolerations,
)
from trainwave.placement.snapshot import NodeInfo

pytestmark = pytest.mark.timeout(10)


def node(**fields: Any) -> NodeInfo:
    base: dict[str, Any] = {
        "name": "n0",
        "labels": {"zone": "a", "gpus": "8"},
        "gpus": 8,
        "allocatable": {"cpu": 64_000, "memory": 512 * 2**30, "pods": 110},
        "max_pods": 110,
    }
    return NodeInfo(**{**base, **fields})


def pod(**spec: Any) -> PodNeeds:
    return pod_needs({"spec": {"containers": [{"name": "w"}], **spec}})


@pytest.mark.parametrize(
    ("toleration", "taint", "tolerated"),
    [
        (Toleration("team", "Equal", "vision", "NoSchedule"), Taint("team", "vision"), True),
        (Toleration("team", "Equal", "audio", "NoSchedule"), Taint("team", "vision"), False),
        (Toleration("team", "Exists", "", "NoSchedule"), Taint("team", "vision"), True),
        (Toleration("team", "Exists", "", ""), Taint("team", "vision", "NoExecute"), True),
        (Toleration("team", "Exists", "", "NoExecute"), Taint("team", "vision"), False),
        (Toleration("", "Exists", "", ""), Taint("anything", "x"), True),
        (Toleration("", "Equal", "", ""), Taint("anything", ""), False),
        (Toleration("team", "", "vision", ""), Taint("team", "vision"), True),
        (Toleration("team", "Gt", "1", ""), Taint("team", "2"), False),
    ],
    ids=["equal", "other-value", "exists", "empty-effect", "other-effect", "empty-key-exists",
         "empty-key-equal", "empty-operator", "unknown-operator"],
)  # fmt: skip
def test_toleration_matching(toleration: Toleration, taint: Taint, tolerated: bool) -> None:
    assert toleration.tolerates(taint) is tolerated


@pytest.mark.parametrize(
    ("taint", "tolerations", "fits"),
    [
        (Taint("team", "vision", "NoSchedule"), [], False),
        (Taint("team", "vision", "NoExecute"), [], False),
        (Taint("team", "vision", "PreferNoSchedule"), [], True),
        (Taint("team", "vision"), [{"key": "team", "value": "vision", "effect": "NoSchedule"}], True),
        (Taint("node.kubernetes.io/not-ready", "", "NoExecute"), "defaults", True),
        (Taint("node.kubernetes.io/not-ready", "", "NoSchedule"), "defaults", False),
    ],
    ids=["no-schedule", "no-execute", "prefer-is-soft", "tolerated", "admission-noexecute",
         "admission-not-noschedule"],
)  # fmt: skip
def test_taints_block_unless_tolerated(taint: Taint, tolerations: Any, fits: bool) -> None:
    needs = (
        with_default_tolerations(pod())
        if tolerations == "defaults"
        else pod(tolerations=tolerations)
    )
    assert (check(needs, node(taints=(taint,))) == ()) is fits


@pytest.mark.parametrize(
    ("expressions", "fits"),
    [
        ([{"key": "zone", "operator": "In", "values": ["a", "b"]}], True),
        ([{"key": "zone", "operator": "In", "values": ["b"]}], False),
        ([{"key": "zone", "operator": "NotIn", "values": ["b"]}], True),
        ([{"key": "absent", "operator": "NotIn", "values": ["b"]}], True),
        ([{"key": "zone", "operator": "Exists"}], True),
        ([{"key": "zone", "operator": "DoesNotExist"}], False),
        ([{"key": "gpus", "operator": "Gt", "values": ["4"]}], True),
        ([{"key": "gpus", "operator": "Lt", "values": ["8"]}], False),
        ([{"key": "zone", "operator": "Gt", "values": ["4"]}], False),
        ([{"key": "zone", "operator": "In", "values": ["a"]},
          {"key": "gpus", "operator": "In", "values": ["4"]}], False),
    ],
    ids=["in", "not-in-set", "notin", "notin-absent", "exists", "does-not-exist", "gt", "lt-strict",
         "gt-not-a-number", "and-of-expressions"],
)  # fmt: skip
def test_required_node_affinity_operators(expressions: list[dict[str, Any]], fits: bool) -> None:
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": expressions}]}}}  # fmt: skip
    assert (check(pod(affinity=affinity), node()) == ()) is fits


def test_terms_are_ored_and_empty_terms_match_nothing() -> None:
    def with_terms(*terms: dict[str, Any]) -> PodNeeds:
        required = {"nodeSelectorTerms": list(terms)}
        return pod(
            affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}
        )

    no = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["x"]}]}
    by_name = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n0"]}]}
    assert check(with_terms(no, by_name), node()) == ()
    assert check(with_terms({}), node()) != (), "only empty terms: matches nothing"
    assert check(pod(nodeSelector={"zone": "b"}), node()) != ()


def test_requests_take_the_init_peak_sidecars_and_overhead() -> None:
    spec = {
        "containers": [{"name": "a", "resources": {"requests": {"cpu": "2"}}},
                       {"name": "b", "resources": {"limits": {"cpu": "1", "nvidia.com/gpu": 4}}}],
        "initContainers": [
            {"name": "sidecar", "restartPolicy": "Always", "resources": {"requests": {"cpu": "500m"}}},
            {"name": "big-init", "resources": {"requests": {"cpu": "5", "memory": "1Gi"}}},
        ],
        "overhead": {"cpu": "100m"},
    }  # fmt: skip
    # Running: 2 + 1 + 0.5 (sidecar) = 3.5; init peak: 5 + 0.5 = 5.5 -> 5.5 + 0.1 overhead.
    assert pod_requests(spec) == {"cpu": 5600, "memory": 2**30, "nvidia.com/gpu": 4}


def test_slots_are_the_tightest_resource_and_host_ports_allow_one() -> None:
    big = node(requested={"cpu": 60_000})
    needs = pod(containers=[{"name": "w", "resources": {"requests": {"cpu": "1"},
                                                         "limits": {"nvidia.com/gpu": 2}}}])  # fmt: skip
    assert worker_slots(needs, node()) == 4, "8 GPUs / 2"
    assert worker_slots(needs, big) == 4, "4 CPUs free / 1"
    assert worker_slots(needs, node(used=7)) == 0
    ports = pod(hostNetwork=True, containers=[{"name": "w", "ports": [{"containerPort": 29500}]}])
    assert worker_slots(ports, node()) == 1
    assert check(ports, node(host_ports=(("0.0.0.0", "TCP", 29500),)))[0].filter == "NodePorts"


def test_cordoned_and_not_ready_nodes_take_nothing() -> None:
    assert check(pod(), node(cordoned=True))[0].what == "cordoned"
    tolerant = pod(tolerations=[{"key": "node.kubernetes.io/unschedulable", "operator": "Exists"}])
    assert check(tolerant, node(cordoned=True)) == ()
    assert check(pod(), node(ready=False))[0].what == "not Ready"


def test_reasons_are_counted_per_node_with_numbers() -> None:
    needs = pod(containers=[{"name": "w", "resources": {"requests": {"cpu": "64"},
                                                         "limits": {"nvidia.com/gpu": 4}}}])  # fmt: skip
    nodes = [node(used=8)] * 3 + [node(taints=(Taint("team", "vision"),))] * 2
    nodes += [node(requested={"cpu": 62_000})]
    message = describe(len(nodes), [check(needs, n) for n in nodes])
    assert message == (
        "0/6 nodes fit a worker: 3 too few free nvidia.com/gpu (needs 4, largest free 0), "
        "2 untolerated taint {team: vision}, 1 too little cpu (needs 64, largest free 2)"
    )
