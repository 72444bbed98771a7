"""Topology files -> kwok Node manifests (tests/cluster/topology.py). Pure, no cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cluster import components
from cluster.topology import (
    KWOK_NODE_ANNOTATION,
    TopologyError,
    build_nodes,
    load_topology,
    parse_topology,
)
from trainwave.contract import (
    GPU_RESOURCE,
    NODE_LABEL_GPU_CLIQUE,
    NODE_LABEL_GPU_COUNT,
    NODE_LABEL_GPU_MEMORY,
    NODE_LABEL_GPU_PRODUCT,
    NODE_LABEL_NVLINK_DOMAIN,
    NODE_LABEL_RACK,
    NODE_LABEL_RDMA,
    NODE_LABEL_RDMA_NICS,
    NODE_LABEL_SPINE,
    RDMA_RESOURCE,
)

TOPOLOGIES = Path(__file__).resolve().parents[1] / "cluster" / "topologies"
H100 = {"product": "NVIDIA-H100-80GB-HBM3", "count": 8, "memoryMiB": 81559}
IB = {"nics": 8, "linkLayer": "IB", "rateGbps": 400}


def make_topology(racks: list[dict[str, Any]] | None = None, **fields: Any) -> dict[str, Any]:
    """One spine of the given rack groups (default: 2 racks x 2 nodes) over an H100+IB node."""
    document: dict[str, Any] = {
        "name": "test",
        "node": {"gpu": dict(H100), "rdma": dict(IB)},
        "spines": [{"racks": racks or [{"count": 2, "nodes": 2}]}],
    }
    document.update(fields)
    return document


def render(document: dict[str, Any]) -> list[dict[str, Any]]:
    return build_nodes(parse_topology(document))


def labels(node: dict[str, Any]) -> dict[str, str]:
    return dict(node["metadata"]["labels"])


@pytest.mark.parametrize(
    ("file", "nodes", "gpus", "racks", "spines"),
    [
        pytest.param("small.yaml", 9, 72, 3, 1, id="small"),
        pytest.param("medium-64.yaml", 64, 512, 8, 2, id="medium-64"),
        pytest.param("large.yaml", 1024, 8192, 64, 4, id="large"),
        pytest.param("xlarge.yaml", 4096, 32768, 256, 16, id="xlarge"),
    ],
)
def test_shipped_topologies_render_their_counts(
    file: str, nodes: int, gpus: int, racks: int, spines: int
) -> None:
    rendered = build_nodes(load_topology(TOPOLOGIES / file))

    assert len(rendered) == nodes
    assert sum(int(n["status"]["capacity"].get(GPU_RESOURCE, 0)) for n in rendered) == gpus
    assert len({labels(n)[NODE_LABEL_RACK] for n in rendered}) == racks
    assert len({labels(n)[NODE_LABEL_SPINE] for n in rendered}) == spines
    assert len({n["metadata"]["name"] for n in rendered}) == nodes


@pytest.mark.parametrize(
    ("key", "value"),
    [
        pytest.param("type", "kwok", id="kwok-type"),
        pytest.param("kubernetes.io/hostname", "gpu-r01-n01", id="hostname-is-name"),
        pytest.param("kubernetes.io/os", "linux", id="os"),
        pytest.param("kubernetes.io/arch", "amd64", id="arch"),
        pytest.param(NODE_LABEL_SPINE, "spine-0", id="spine"),
        pytest.param(NODE_LABEL_RACK, "rack-01", id="rack"),
        pytest.param(NODE_LABEL_NVLINK_DOMAIN, "rack-01-nvl1", id="nvlink-domain-per-node"),
        pytest.param(NODE_LABEL_GPU_PRODUCT, "NVIDIA-H100-80GB-HBM3", id="gpu-product"),
        pytest.param(NODE_LABEL_GPU_COUNT, "8", id="gpu-count"),
        pytest.param(NODE_LABEL_GPU_MEMORY, "81559", id="gpu-memory-mib"),
        pytest.param(NODE_LABEL_RDMA, "infiniband", id="rdma-link-layer"),
        pytest.param(NODE_LABEL_RDMA_NICS, "8", id="rdma-nics"),
    ],
)
def test_last_node_labels(key: str, value: str) -> None:
    last = render(make_topology())[-1]

    assert last["metadata"]["name"] == "gpu-r01-n01"
    assert labels(last)[key] == value


def test_node_is_managed_by_kwok_and_untainted() -> None:
    node = render(make_topology())[0]

    assert node["metadata"]["annotations"][KWOK_NODE_ANNOTATION] == "fake"
    assert "taints" not in node.get("spec", {})


@pytest.mark.parametrize(
    ("node", "resource", "quantity"),
    [
        pytest.param({}, "cpu", "128", id="cpu-default"),
        pytest.param({"cpu": 96}, "cpu", "96", id="cpu-int-becomes-string"),
        pytest.param({}, "memory", "2Ti", id="memory-default"),
        pytest.param({}, "pods", "110", id="pods-default"),
        pytest.param({}, "ephemeral-storage", "10Ti", id="ephemeral-storage"),
        pytest.param({}, GPU_RESOURCE, "8", id="gpus"),
        pytest.param({}, RDMA_RESOURCE, "1000", id="rdma-hca-max-default"),
        pytest.param({"rdma": {**IB, "hcaMax": 64}}, RDMA_RESOURCE, "64", id="rdma-hca-max"),
    ],
)
def test_capacity_equals_allocatable(node: dict[str, Any], resource: str, quantity: str) -> None:
    document = make_topology()
    document["node"].update(node)

    status = render(document)[0]["status"]

    assert status["capacity"][resource] == quantity
    assert status["allocatable"] == status["capacity"]


@pytest.mark.parametrize(
    ("node", "absent_labels", "absent_resource"),
    [
        pytest.param({"rdma": None}, [NODE_LABEL_RDMA, NODE_LABEL_RDMA_NICS], RDMA_RESOURCE,
                     id="no-rdma"),
        pytest.param({"gpu": None}, [NODE_LABEL_GPU_PRODUCT, NODE_LABEL_NVLINK_DOMAIN],
                     GPU_RESOURCE, id="cpu-only"),
    ],
)  # fmt: skip
def test_optional_hardware_leaves_no_trace(
    node: dict[str, Any], absent_labels: list[str], absent_resource: str
) -> None:
    document = make_topology()
    document["node"].update(node)

    rendered = render(document)[0]

    assert not set(absent_labels) & set(labels(rendered))
    assert absent_resource not in rendered["status"]["capacity"]


def test_rack_override_changes_only_its_racks() -> None:
    a100 = {"gpu": {"product": "NVIDIA-A100-SXM4-80GB", "memoryMiB": 81920}, "rdma": None}
    document = make_topology(
        racks=[{"count": 1, "nodes": 2}, {"count": 1, "nodes": 3, "node": a100}]
    )

    products = [labels(n)[NODE_LABEL_GPU_PRODUCT] for n in render(document)]

    assert products == ["NVIDIA-H100-80GB-HBM3"] * 2 + ["NVIDIA-A100-SXM4-80GB"] * 3
    assert [NODE_LABEL_RDMA in labels(n) for n in render(document)] == [True] * 2 + [False] * 3


def test_spine_override_merges_field_by_field_under_rack_override() -> None:
    document = make_topology()
    document["spines"] = [
        {"racks": [{"nodes": 1}]},
        {
            "node": {"rdma": {"linkLayer": "RoCE"}, "gpu": {"count": 4}},
            "racks": [{"nodes": 1}, {"nodes": 1, "node": {"gpu": {"count": 2}}}],
        },
    ]

    rendered = render(document)

    assert [labels(n)[NODE_LABEL_RDMA] for n in rendered] == ["infiniband", "roce", "roce"]
    assert [n["status"]["capacity"][GPU_RESOURCE] for n in rendered] == ["8", "4", "2"]
    assert {labels(n)[NODE_LABEL_RDMA_NICS] for n in rendered} == {"8"}


@pytest.mark.parametrize(
    ("nodes_per_rack", "per_domain", "domains", "clique"),
    [
        pytest.param(4, 1, ["rack-00-nvl0", "rack-00-nvl1", "rack-00-nvl2", "rack-00-nvl3"],
                     False, id="hgx-one-node-per-domain"),
        pytest.param(4, 2, ["rack-00-nvl0", "rack-00-nvl0", "rack-00-nvl1", "rack-00-nvl1"],
                     True, id="two-nodes-per-domain"),
        pytest.param(3, 18, ["rack-00-nvl0"] * 3, True, id="domain-capped-at-rack"),
    ],
)  # fmt: skip
def test_nvlink_domains_group_consecutive_nodes_within_a_rack(
    nodes_per_rack: int, per_domain: int, domains: list[str], clique: bool
) -> None:
    document = make_topology(racks=[{"nodes": nodes_per_rack}])
    document["node"]["nvlink"] = {"nodesPerDomain": per_domain}

    rendered = render(document)

    assert [labels(n)[NODE_LABEL_NVLINK_DOMAIN] for n in rendered] == domains
    expected_clique = [f"test.{d}" for d in domains] if clique else [None] * len(domains)
    assert [labels(n).get(NODE_LABEL_GPU_CLIQUE) for n in rendered] == expected_clique


def test_names_are_numbered_across_spines_and_padded() -> None:
    document = make_topology(
        spines=[{"count": 2, "racks": [{"count": 6, "nodes": 12}]}], nodeNamePrefix="h100"
    )

    names = [n["metadata"]["name"] for n in render(document)]

    assert names[0] == "h100-r00-n00"
    assert names[-1] == "h100-r11-n11"
    assert names == sorted(names)


@pytest.mark.parametrize(
    ("document", "message"),
    [
        pytest.param(make_topology(racks=[{"nodes": 0}]),
                     "spines[0].racks[0].nodes: Input should be greater than or equal to 1",
                     id="zero-nodes"),
        pytest.param(make_topology(node={"gpu": {"product": "H100", "count": 8}}),
                     "node.gpu.memoryMiB: Field required", id="gpu-memory-missing"),
        pytest.param(make_topology(node={"gpu": {**H100, "product": "NVIDIA H100"}}),
                     "node.gpu.product: expected a label value", id="product-with-space"),
        pytest.param(make_topology(node={"rdma": {**IB, "linkLayer": "Ethernet"}}),
                     "node.rdma.linkLayer: Input should be 'IB' or 'RoCE' (got 'Ethernet')",
                     id="bad-link-layer"),
        pytest.param(make_topology(node={"cpu": "lots"}),
                     "node.cpu: expected a Kubernetes quantity such as 96, 500m or 2Ti "
                     "(got 'lots')", id="bad-quantity"),
        pytest.param(make_topology(racks=[{"nodes": 1, "node": {"gpu": {"count": 0}}}]),
                     "spines[0].racks[0].node.gpu.count: Input should be greater than",
                     id="bad-rack-override"),
        pytest.param(make_topology(racks=[{"nodes": 1, "node": {"gpus": 8}}]),
                     "spines[0].racks[0].node.gpus: Extra inputs are not permitted",
                     id="unknown-override-field"),
        pytest.param(make_topology(name="My_Cluster"),
                     "name: expected a DNS label", id="bad-name"),
        pytest.param({"name": "x", "spine": []}, "spines: Field required", id="no-spines"),
        pytest.param(["not", "a", "mapping"], "expected a mapping, got list", id="not-a-mapping"),
        pytest.param(make_topology(spines=[{"count": 1000, "racks": [{"count": 64, "nodes": 16}]}]),
                     "spines: 1024000 nodes in all; at most 20000", id="too-many-nodes"),
    ],
)  # fmt: skip
def test_errors_name_the_field(document: Any, message: str) -> None:
    with pytest.raises(TopologyError) as raised:
        parse_topology(document, source="topo.yaml")

    assert f"topo.yaml: {message}" in str(raised.value)


def test_unreadable_file_names_the_path(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("spines: [\n")

    with pytest.raises(TopologyError, match=r"broken\.yaml: cannot read topology"):
        load_topology(broken)


@pytest.mark.parametrize(
    ("nodes", "lease", "grace"),
    [
        pytest.param(9, 120, "180s", id="small"),
        pytest.param(1024, 120, "180s", id="large"),
        pytest.param(1025, 240, "360s", id="just-over"),
        pytest.param(4096, 480, "720s", id="xlarge"),
    ],
)
def test_node_lease_grows_with_the_node_count(nodes: int, lease: int, grace: str) -> None:
    # kwok renews every quarter lease: 4,096 nodes at 120 s were ~136 renewals/s.
    assert components.node_lease_seconds(nodes) == lease
    assert components.node_monitor_grace(lease) == grace
