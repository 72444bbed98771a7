"""The placement engine's inputs: the topology tree and the snapshot built from raw objects."""

from __future__ import annotations

import random
from itertools import pairwise
from typing import Any

import pytest
from placement_factories import (
    TOPOLOGIES,
    make_cluster,
    make_node,
    nvl_topology,
    topology_snapshot,
)

from cluster.topology import build_nodes, load_topology
from trainwave.contract import GPU_RESOURCE, NODE_LABEL_NVLINK_DOMAIN, NODE_LABEL_RACK
from trainwave.placement.gang_types import GangRequest
from trainwave.placement.snapshot import ClusterSnapshot, build_snapshot, pod_gpus
from trainwave.placement.topology import HOSTNAME_LABEL, build_topology

pytestmark = pytest.mark.timeout(10)


@pytest.mark.parametrize(
    ("name", "levels", "domains"),
    [
        pytest.param("small", ["cluster", "spine", "rack", "node"], [1, 1, 3, 9], id="small"),
        pytest.param("medium-64", ["cluster", "spine", "rack", "node"], [1, 2, 8, 64], id="medium"),
        pytest.param("large", ["cluster", "spine", "rack", "node"], [1, 4, 64, 1024], id="large"),
    ],
)
def test_tree_of_the_simulated_topologies(name: str, levels: list[str], domains: list[int]) -> None:
    topology = topology_snapshot(name).topology
    assert [level.name for level in topology.levels] == levels
    assert [len(level) for level in topology.domains] == domains
    assert topology.nvlink_level is None  # one node per NVLink domain: the level adds nothing
    assert topology.pipeline_level == levels.index("rack")


def test_every_domain_is_a_contiguous_range_split_by_its_children() -> None:
    topology = topology_snapshot("large").topology
    for level, domains in enumerate(topology.domains[:-1]):
        for domain in domains:
            children = [topology.domains[level + 1][c] for c in domain.children]
            assert children[0].first == domain.first
            assert children[-1].stop == domain.stop
            assert all(a.stop == b.first for a, b in pairwise(children))
            for node in range(domain.first, domain.stop):
                assert topology.domain_of(node, level) is domain


def test_multi_node_nvlink_domains_form_a_level() -> None:
    topology = nvl_topology(racks=2, nodes=8, per_domain=4).topology
    assert [level.name for level in topology.levels] == [
        "cluster", "spine", "rack", "NVLink domain", "node"
    ]  # fmt: skip
    assert topology.nvlink_level == 3
    assert topology.pipeline_level == 2
    assert [d.value for d in topology.domains[3]] == [
        "rack-00-nvl0", "rack-00-nvl1", "rack-01-nvl0", "rack-01-nvl1"
    ]  # fmt: skip
    assert topology.level_of(NODE_LABEL_NVLINK_DOMAIN) == 3
    assert topology.level_of("nvidia.com/gpu.clique") == 3


@pytest.mark.parametrize(
    ("name", "level"),
    [
        pytest.param("rack", 2, id="by-name"),
        pytest.param(NODE_LABEL_RACK, 2, id="by-label"),
        pytest.param(HOSTNAME_LABEL, 3, id="hostname-is-node"),
        pytest.param("nvlink", 3, id="single-node-nvlink-is-node"),
        pytest.param("cluster", 0, id="cluster"),
        pytest.param("zone", None, id="unknown"),
    ],
)
def test_levels_are_named_by_label_or_name(name: str, level: int | None) -> None:
    assert make_cluster([8]).topology.level_of(name) == level


def test_nodes_sort_naturally_and_input_order_does_not_matter() -> None:
    names = [f"r{rack}-n{node}" for rack in (2, 10, 1) for node in (10, 9)]
    nodes = [make_node(name, rack=name.split("-")[0]) for name in names]
    random.Random(3).shuffle(nodes)
    topology = ClusterSnapshot.of(nodes).topology
    assert topology.node_names == (
        "r1-n9", "r1-n10", "r2-n9", "r2-n10", "r10-n9", "r10-n10"
    )  # fmt: skip


def test_a_node_without_a_rack_label_is_a_rack_of_its_own() -> None:
    nodes = [make_node("a", rack=None), make_node("b", rack=None), make_node("c")]
    topology = ClusterSnapshot.of(nodes).topology
    racks = topology.domains[2]
    assert len(racks) == 3
    assert sorted(d.value for d in racks) == ["(no rack: a)", "(no rack: b)", "rack-0"]


def test_same_rack_name_under_two_spines_is_two_racks() -> None:
    nodes = [make_node("a", spine="s0", rack="r"), make_node("b", spine="s1", rack="r")]
    assert len(ClusterSnapshot.of(nodes).topology.domains[2]) == 2


@pytest.mark.parametrize(
    "levels",
    [
        pytest.param([NODE_LABEL_RACK, NODE_LABEL_RACK], id="repeated"),
        pytest.param([NODE_LABEL_NVLINK_DOMAIN], id="nvlink-listed"),
    ],
)
def test_bad_levels_are_refused(levels: list[str]) -> None:
    with pytest.raises(ValueError, match="level"):
        build_topology(levels, [])


# --- the snapshot built from raw Kubernetes objects --------------------------------


def make_pod(
    node: str | None,
    gpus: int = 8,
    *,
    phase: str = "Running",
    init: int = 0,
    deleting: bool = False,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [{"name": "worker", "resources": {"limits": {GPU_RESOURCE: str(gpus)}}}]
    }
    if init:
        spec["initContainers"] = [{"name": "init", "resources": {"limits": {GPU_RESOURCE: init}}}]
    if node is not None:
        spec["nodeName"] = node
    metadata: dict[str, Any] = {"name": "p"}
    if deleting:
        metadata["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": metadata, "spec": spec, "status": {"phase": phase}}


def small_nodes() -> list[dict[str, Any]]:
    return build_nodes(load_topology(TOPOLOGIES / "small.yaml"))


NODE = "gpu-r00-n00"


@pytest.mark.parametrize(
    ("pods", "used"),
    [
        pytest.param([make_pod(NODE)], 8, id="bound-running"),
        pytest.param([make_pod(NODE, 2), make_pod(NODE, 3, phase="Pending")], 5, id="two-pods"),
        pytest.param([make_pod(NODE, phase="Succeeded")], 0, id="succeeded-frees"),
        pytest.param([make_pod(NODE, phase="Failed")], 0, id="failed-frees"),
        pytest.param([make_pod(None)], 0, id="unbound-holds-nothing"),
        pytest.param([make_pod(NODE, deleting=True)], 8, id="terminating-still-holds"),
        pytest.param([make_pod(NODE, 2, init=4)], 4, id="init-container-larger"),
    ],
)
def test_bound_pods_use_gpus(pods: list[dict[str, Any]], used: int) -> None:
    snapshot = build_snapshot(small_nodes(), pods)
    assert snapshot.node(NODE).used == used
    assert snapshot.node(NODE).free == 8 - used


def test_pod_without_gpus_uses_none() -> None:
    assert pod_gpus({"spec": {"containers": [{"name": "c"}]}}) == 0


def test_released_pods_not_bound_yet_count_on_their_node() -> None:
    released = make_pod("", 4)
    released["metadata"] = {"annotations": {"trainwave.io/node": NODE}}
    gated = make_pod("", 8)
    gated["metadata"] = {"annotations": {"trainwave.io/node": NODE}}
    gated["spec"]["schedulingGates"] = [{"name": "trainwave.io/placement"}]
    snapshot = build_snapshot(small_nodes(), [make_pod(NODE, 2), released, gated])
    assert snapshot.node(NODE).free == 2, "2 bound + 4 reserved; a gated pod holds nothing"


@pytest.mark.parametrize(
    ("change", "schedulable"),
    [
        pytest.param({"spec": {"unschedulable": True}}, False, id="cordoned"),
        pytest.param({"status": {"conditions": [{"type": "Ready", "status": "False"}]}}, False,
                     id="not-ready"),
        pytest.param({"status": {"conditions": [{"type": "Ready", "status": "True"}]}}, True,
                     id="ready"),
        pytest.param({"spec": {"taints": [{"key": "maintenance", "effect": "NoSchedule"}]}}, False,
                     id="tainted"),
        pytest.param({"spec": {"taints": [{"key": GPU_RESOURCE, "effect": "NoSchedule"}]}}, True,
                     id="gpu-taint-tolerated"),
        pytest.param({"spec": {"taints": [{"key": "x", "effect": "PreferNoSchedule"}]}}, True,
                     id="soft-taint"),
    ],
)  # fmt: skip
def test_nodes_that_take_no_new_pods_offer_nothing(
    change: dict[str, Any], schedulable: bool
) -> None:
    nodes = small_nodes()
    for key, value in change.items():
        nodes[0].setdefault(key, {}).update(value)
    snapshot = build_snapshot(nodes, [])
    index = snapshot.topology.node_index[NODE]
    assert snapshot.slots(GangRequest("job", 1, 8).needs)[index] == (1 if schedulable else 0)


def test_snapshot_carries_topology_labels_and_capacity() -> None:
    snapshot = build_snapshot(small_nodes(), [])
    assert len(snapshot.nodes) == 9
    assert snapshot.node(NODE).gpus == 8
    assert snapshot.node(NODE).labels[NODE_LABEL_RACK] == "rack-00"


def test_gpus_offered_for_sharing_are_not_whole_gpus_for_gangs() -> None:
    snapshot = build_snapshot(small_nodes(), [])
    shared = [n for n in snapshot.nodes if n.labels[NODE_LABEL_RACK] == "rack-02"]
    assert [(n.name, n.gpus) for n in shared] == [("gpu-r02-n00", 0)]
    assert sum(n.gpus for n in snapshot.nodes) == 64


def test_with_usage_returns_a_new_snapshot_sharing_the_tree() -> None:
    before = make_cluster([8, 8])
    after = before.with_usage({"r0-n0": 6})
    assert before.free == (8, 8)
    assert after.free == (2, 8)
    assert after.topology is before.topology
    assert after.with_usage({"r0-n0": -6}).free == (8, 8)
    assert after.emptied().free == (8, 8)
    assert after.restricted(["r0-n1"]).free == (0, 8)
