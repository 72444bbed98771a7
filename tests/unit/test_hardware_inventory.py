"""The inventory annotation both ways: the agent's types in, the same types out, bad fields named."""

from __future__ import annotations

import json
from typing import Any

import pytest

from cluster.inventory import inventory_annotation
from trainwave import contract
from trainwave.hardware.inventory import (
    GdrReadiness,
    GpuInfo,
    GpuNicDistance,
    InventoryError,
    NicInfo,
    NodeInventory,
    decode,
    encode,
    from_document,
)
from trainwave.hardware.pci import Distance
from trainwave.placement.records import node_record

pytestmark = pytest.mark.timeout(10)


def gpu(index: int) -> GpuInfo:
    return GpuInfo(
        index, f"GPU-{index}", "NVIDIA H100 80GB HBM3", 81559, f"0000:{index:02x}:00.0", 0
    )


INVENTORY = NodeInventory(
    gpus=(gpu(0), gpu(1), gpu(2)),
    nvlink_islands=((0, 1),),
    nics=(
        NicInfo(
            "mlx5_0",
            1,
            "ACTIVE",
            "RoCE",
            400.0,
            "pci0000:00/0000:00:01.0/0000:19:00.0",
            0,
            ((0, "IB/RoCE v1"), (3, "RoCE v2")),
        ),
        NicInfo("mlx5_1", 1, "DOWN", "IB", 200.0, None, None),
    ),
    nearest_nics=(
        GpuNicDistance(0, "mlx5_0:1", Distance.PIX),
        GpuNicDistance(1, "mlx5_0:1", Distance.SYS),
        GpuNicDistance(2, None, None),
    ),
    gdr=GdrReadiness(True, "nvidia_peermem", False, "peer memory module nvidia_peermem loaded"),
    problems=("/sys/class/infiniband/mlx5_2/ports/x: port 'x' is not a number; skipped",),
    shared=(2,),
)


def test_what_the_agent_writes_reads_back_as_the_same_inventory() -> None:
    assert decode(encode(INVENTORY)) == INVENTORY
    assert [g.uuid for g in decode(encode(INVENTORY)).shared_gpus] == ["GPU-2"]


def test_a_simulated_nodes_annotation_reads_back() -> None:
    text = inventory_annotation(
        "n", gpus=8, product="H100", memory_mib=81559, nics=8, link_layer="RoCE",
        rate_gbps=400, gpu_direct=True, shared=True,
    )[contract.ANNOTATION_INVENTORY]  # fmt: skip
    found = decode(text)
    assert len(found.gpus) == 8
    assert len(found.shared_gpus) == 8
    assert {nic.roce_v2_gid_indices for nic in found.nics} == {(3,)}
    assert json.loads(encode(found)) == json.loads(text)


def test_fields_a_newer_agent_adds_are_ignored_and_missing_sections_are_empty() -> None:
    document: dict[str, Any] = json.loads(encode(INVENTORY))
    document["futureField"] = {"anything": 1}
    document["gpus"][0]["clockMHz"] = 1980
    assert from_document(document) == INVENTORY
    bare = from_document({"gpus": [{"index": 0, "uuid": "GPU-0", "memoryMiB": 1024}]})
    assert bare.nics == ()
    assert bare.shared == ()
    assert not bare.gdr.possible


def spoil(path: str, value: Any) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(encode(INVENTORY))
    *parents, last = path.split("/")
    target: Any = document
    for key in parents:
        target = target[int(key)] if isinstance(target, list) else target[key]
    target[int(last) if isinstance(target, list) else last] = value
    return document


BAD = {
    "gpu-index-text": (spoil("gpus/0/index", "0"), "gpus[0].index: '0', expected an integer"),
    "gpu-memory-bool": (spoil("gpus/1/memoryMiB", True), "gpus[1].memoryMiB: True, expected"),
    "gpu-uuid-missing": (spoil("gpus/0/uuid", None), "gpus[0].uuid: None, expected a string"),
    "nics-not-a-list": (spoil("nics", {"mlx5_0": {}}), "nics: {'mlx5_0': {}}, expected a list"),
    "nic-hca-no-port": (spoil("nics/0/hca", "mlx5_0"), "nics[0].hca: 'mlx5_0', expected <device>"),
    "nic-layer": (spoil("nics/1/linkLayer", "Ethernet"), "nics[1].linkLayer: 'Ethernet'"),
    "nic-rate-text": (
        spoil("nics/0/rateGbps", "400"),
        "nics[0].rateGbps: '400', expected a number",
    ),
    "distance-name": (spoil("nearestNic/0/distance", "NEAR"), "nearestNic.0.distance: 'NEAR'"),
    "nearest-key": (spoil("nearestNic/first", {}), "nearestNic.first: key 'first'"),
    "gdr-possible": (spoil("gdr/possible", "yes"), "gdr.possible: 'yes', expected true or false"),
    "shared-stray": (spoil("sharedGpus/0/index", 7), "sharedGpus: GPU index(es) [7]"),
    "island-text": (spoil("nvlinkIslands/0", "0,1"), "nvlinkIslands[0]: '0,1', expected a list"),
    "not-an-object": ([], "inventory: [], expected an object"),
}


@pytest.mark.parametrize(("document", "message"), BAD.values(), ids=BAD.keys())
def test_a_malformed_field_is_named_with_its_value(document: Any, message: str) -> None:
    with pytest.raises(InventoryError) as raised:
        from_document(document)
    assert message in str(raised.value)


def test_placement_ignores_an_unreadable_annotation_and_says_why() -> None:
    node = {
        "metadata": {
            "name": "gpu-0",
            "annotations": {contract.ANNOTATION_INVENTORY: json.dumps(spoil("gdr/possible", 1))},
        },
        "status": {"allocatable": {contract.GPU_RESOURCE: "8"}},
    }
    record = node_record(node)
    assert record.inventory is None
    assert record.shared == ()
    assert record.inventory_problem == (
        f"annotation {contract.ANNOTATION_INVENTORY}: gdr.possible: 1, expected true or false"
    )
    node["metadata"]["annotations"][contract.ANNOTATION_INVENTORY] = "{not json"
    assert "not JSON" in node_record(node).inventory_problem
    node["metadata"]["annotations"][contract.ANNOTATION_INVENTORY] = encode(INVENTORY)
    readable = node_record(node)
    assert readable.inventory == INVENTORY
    assert readable.inventory_problem == ""
    assert [g.uuid for g in readable.shared] == ["GPU-2"]
