"""The worker's own topology spread constraints in gang placement (placement/spread.py).

Cases from the Kubernetes documentation of Pod Topology Spread Constraints
(https://kubernetes.io/docs/concepts/scheduling-eviction/topology-spread-constraints/):
the 4-node, 2-zone example with one and two constraints, minDomains, node inclusion
policies; then what a gang adds: its own workers count as they are placed.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from trainwave.contract import GPU_RESOURCE
from trainwave.placement.gang import place
from trainwave.placement.gang_types import Blocker, GangRequest, Placement, Unschedulable
from trainwave.placement.ranks import Parallelism
from trainwave.placement.requirements import pod_needs
from trainwave.placement.snapshot import ClusterSnapshot, build_snapshot
from trainwave.placement.topology import HOSTNAME_LABEL

pytestmark = pytest.mark.timeout(10)

ZONE = "topology.kubernetes.io/zone"
LEVELS = (ZONE, HOSTNAME_LABEL)


def raw_node(name: str, zone: str | None, gpus: int = 8, **labels: str) -> dict[str, Any]:
    all_labels = {HOSTNAME_LABEL: name, **labels}
    if zone is not None:
        all_labels[ZONE] = zone
    return {
        "metadata": {"name": name, "labels": all_labels},
        "status": {
            "allocatable": {GPU_RESOURCE: str(gpus), "cpu": "64", "memory": "512Gi", "pods": "110"}
        },
    }


def raw_pod(name: str, node: str, labels: dict[str, str], namespace: str = "ns") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"nodeName": node, "containers": [{"name": "c"}]},
    }


def spread(key: str = ZONE, skew: int = 1, hard: bool = True, **more: Any) -> dict[str, Any]:
    return {
        "maxSkew": skew,
        "topologyKey": key,
        "whenUnsatisfiable": "DoNotSchedule" if hard else "ScheduleAnyway",
        "labelSelector": {"matchLabels": {"foo": "bar"}},
        **more,
    }


def gang(workers: int, *constraints: dict[str, Any], **spec: Any) -> GangRequest:
    pod = {
        "metadata": {"name": "w-0", "namespace": "ns", "labels": {"foo": "bar"}},
        "spec": {
            "containers": [{"name": "w", "resources": {"limits": {GPU_RESOURCE: "1"}}}],
            "topologySpreadConstraints": list(constraints),
            **spec,
        },
    }
    return GangRequest("job", workers, 1, pod=pod_needs(pod))


def docs_cluster(*extra_nodes: dict[str, Any]) -> ClusterSnapshot:
    """node1, node2 in zoneA, node3, node4 in zoneB; foo=bar pods on node1, node2, node3."""
    nodes = [
        raw_node("node1", "zoneA"),
        raw_node("node2", "zoneA"),
        raw_node("node3", "zoneB"),
        raw_node("node4", "zoneB"),
        *extra_nodes,
    ]
    pods = [raw_pod(f"p{i}", f"node{i}", {"foo": "bar"}) for i in (1, 2, 3)]
    return build_snapshot(nodes, pods, levels=LEVELS)


def placed(result: Placement | Unschedulable) -> tuple[str, ...]:
    assert isinstance(result, Placement), result
    return result.nodes


def test_one_constraint_sends_the_pod_to_the_emptier_zone() -> None:
    """Docs: with 2 matching pods in zoneA and 1 in zoneB, zoneA would make the skew 2."""
    assert placed(place(docs_cluster(), gang(1, spread())))[0] in ("node3", "node4")


def test_two_constraints_leave_only_node4() -> None:
    """Docs: zone and node constraints together leave node4, the only empty node of zoneB."""
    result = place(docs_cluster(), gang(1, spread(), spread(HOSTNAME_LABEL)))
    assert placed(result) == ("node4",)


def test_without_spread_the_gang_packs_onto_one_node() -> None:
    """The control: the topology objective alone keeps four workers on one node."""
    result = place(docs_cluster(), gang(4))
    assert len(set(placed(result))) == 1


def test_the_gangs_own_workers_count_as_they_are_placed() -> None:
    """4 workers on an empty 2-zone cluster, maxSkew 1: two per zone, each pair on one node."""
    nodes = [raw_node(f"n{i}", "a" if i < 2 else "b") for i in range(4)]
    result = place(build_snapshot(nodes, [], levels=LEVELS), gang(4, spread()))
    where = placed(result)
    zones = sorted("a" if n in ("n0", "n1") else "b" for n in where)
    assert zones == ["a", "a", "b", "b"]
    assert len(set(where)) == 2, "inside a zone the workers still share a node"


def test_a_compact_placement_that_keeps_the_skew_stands() -> None:
    """maxSkew 4 allows all four workers in one zone, so the topology objective decides."""
    nodes = [raw_node(f"n{i}", "a" if i < 2 else "b") for i in range(4)]
    result = place(build_snapshot(nodes, [], levels=LEVELS), gang(4, spread(skew=4)))
    assert len(set(placed(result))) == 1


def test_min_domains_caps_each_zone_at_max_skew() -> None:
    """Fewer zones than minDomains: the global minimum is 0, so each zone takes maxSkew."""
    nodes = [raw_node(f"n{i}", "a" if i < 2 else "b") for i in range(4)]
    snapshot = build_snapshot(nodes, [], levels=LEVELS)
    assert len(placed(place(snapshot, gang(2, spread(minDomains=3))))) == 2
    refused = place(snapshot, gang(3, spread(minDomains=3)))
    assert isinstance(refused, Unschedulable)
    assert refused.code is Blocker.TOPOLOGY_SPREAD
    assert "2 workers placed within the topology spread" in refused.reason
    assert "0/4 nodes fit worker 3 of 3" in refused.reason
    assert f"4 would break topology spread on {ZONE} (maxSkew 1)" in refused.reason


def test_nodes_without_the_key_are_not_candidates() -> None:
    """filtering.go: a node lacking a DoNotSchedule topologyKey is unresolvable."""
    snapshot = docs_cluster(raw_node("bare", None))
    result = place(snapshot, gang(1, spread()))
    assert placed(result) != ("bare",)
    full = build_snapshot([raw_node("bare", None)], [], levels=LEVELS)
    refused = place(full, gang(1, spread()))
    assert isinstance(refused, Unschedulable)
    assert f"1 missing topology label {ZONE}" in refused.reason


def test_node_affinity_policy_honor_leaves_unselected_zones_out() -> None:
    """Docs: a zone the pod's nodeSelector excludes does not pull the minimum to 0."""
    extra = raw_node("node5", "zoneC", pool="other")
    selected = {"nodeSelector": {"pool": "main"}}
    nodes = [raw_node(n, z, pool="main") for n, z in (("node1", "zoneA"), ("node3", "zoneB"))]
    pods = [raw_pod("p1", "node1", {"foo": "bar"}), raw_pod("p3", "node3", {"foo": "bar"})]
    snapshot = build_snapshot([*nodes, extra], pods, levels=LEVELS)
    # zoneA 1, zoneB 1; zoneC (count 0) is excluded, so one more pod may go to zoneA.
    assert len(placed(place(snapshot, gang(1, spread(), **selected)))) == 1
    ignored = spread(nodeAffinityPolicy="Ignore")
    refused = place(snapshot, gang(1, ignored, **selected))
    assert isinstance(refused, Unschedulable), "zoneC counts 0 under Ignore: skew would be 2"


def test_other_namespaces_and_selectors_do_not_count() -> None:
    nodes = [raw_node("n0", "a"), raw_node("n1", "b")]
    pods = [
        raw_pod("x", "n0", {"foo": "bar"}, namespace="elsewhere"),
        raw_pod("y", "n0", {"foo": "baz"}),
    ]
    snapshot = build_snapshot(nodes, pods, levels=LEVELS)
    assert len(placed(place(snapshot, gang(2, spread(skew=2))))) == 2
    assert set(placed(place(snapshot, gang(1, spread(HOSTNAME_LABEL))))) <= {"n0", "n1"}


def test_a_nil_selector_matches_no_pod_so_never_restricts() -> None:
    constraint = spread()
    del constraint["labelSelector"]
    nodes = [raw_node(f"n{i}", "a" if i < 2 else "b") for i in range(4)]
    result = place(build_snapshot(nodes, [], levels=LEVELS), gang(4, constraint))
    assert len(set(placed(result))) == 1


def test_match_label_keys_narrow_the_selector_to_the_pods_value() -> None:
    needs = gang(1, spread(matchLabelKeys=["foo", "absent"])).needs
    [constraint] = needs.spread
    assert constraint.selector is not None
    assert constraint.selector.matches({"foo": "bar"})
    assert not constraint.selector.matches({"foo": "other"})
    assert constraint.self_match


def test_schedule_anyway_prefers_the_emptier_zone_without_breaking_the_gang() -> None:
    """A soft constraint only breaks ties after the topology objective."""
    nodes = [raw_node("n0", "a"), raw_node("n1", "b")]
    pods = [raw_pod("p", "n0", {"foo": "bar"}, namespace="ns")]
    snapshot = build_snapshot(nodes, pods, levels=LEVELS)
    assert placed(place(snapshot, gang(2, spread(hard=False)))) == ("n1", "n1")
    assert placed(place(snapshot, gang(2))) in (("n0", "n0"), ("n1", "n1"))


def test_tensor_groups_and_a_broken_spread_are_refused_with_the_reason() -> None:
    nodes = [raw_node(f"n{i}", "a" if i < 2 else "b") for i in range(4)]
    request = gang(4, spread())
    tensor = replace(request, gpus_per_worker=2, parallelism=Parallelism(tensor=4))
    refused = place(build_snapshot(nodes, [], levels=LEVELS), tensor)
    assert isinstance(refused, Unschedulable)
    assert refused.code is Blocker.TOPOLOGY_SPREAD
    assert "tensor or pipeline groups" in refused.reason
