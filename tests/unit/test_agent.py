"""The node agent's discovery, against fake GPUs and fake sysfs/procfs trees."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from agent_trees import (
    GPU_MEMORY_MIB,
    OPEN_DRIVER,
    ROCE_GIDS,
    add_gpu,
    add_nic,
    make_backend,
    make_node,
    write,
)

from cluster.topology import NodeShape, build_node
from trainwave import contract
from trainwave.agent.discovery import discover
from trainwave.agent.labels import build_annotations, build_labels
from trainwave.agent.nvml import GpuBackendError, NvmlBackend
from trainwave.contract import ANNOTATION_INVENTORY
from trainwave.hardware.inventory import NodeInventory
from trainwave.hardware.pci import Distance, normalize_bus_id, pci_distance

pytestmark = pytest.mark.timeout(10)

PIX8: list[tuple[str | None, Distance | None]] = [(f"mlx5_{i}:1", Distance.PIX) for i in range(8)]


@dataclass(frozen=True)
class Node:
    id: str
    build: Callable[[Path], object]
    gpus: int = 8
    gdr: bool = True
    reason: str = "nvidia_peermem loaded"
    nearest: list[tuple[str | None, Distance | None]] = field(default_factory=lambda: PIX8)
    labels: dict[str, str] = field(default_factory=dict)


def _across_socket(root: Path) -> None:
    add_gpu(root, 0)  # socket 0
    add_nic(root, "mlx5_0", 0, socket=1)  # same pair numbering, other socket's host bridge
    write(root / "sys/module/nvidia_peermem/refcnt", "0\n")


NODES = [
    Node("healthy-ib", make_node, labels={contract.NODE_LABEL_RDMA: "infiniband"}),
    Node(
        "roce-with-gid-types",
        lambda root: make_node(root, link_layer="Ethernet", gid_types=ROCE_GIDS),
        labels={contract.NODE_LABEL_RDMA: "roce", contract.NODE_LABEL_RDMA_NICS: "8"},
    ),
    Node(
        "rdma-without-peer-memory",
        lambda root: make_node(root, peermem=None),
        gdr=False,
        reason="no peer memory module (nvidia_peermem) loaded and no DMA-BUF path: "
        "the proprietary NVIDIA kernel module cannot export DMA-BUF",
    ),
    Node(
        "rdma-open-module-old-kernel",
        lambda root: make_node(root, peermem=None, driver=OPEN_DRIVER, kernel="5.4.0-150"),
        gdr=False,
        reason="kernel 5.4.0-150; DMA-BUF needs 5.12 or newer",
    ),
    Node(
        "dmabuf-open-module",
        lambda root: make_node(root, peermem=None, driver=OPEN_DRIVER),
        reason="DMA-BUF: open kernel module R550 on kernel 5.15.0-105-generic",
    ),
    Node("peermem-only-in-proc-modules", lambda root: make_node(root, peermem="procmodules")),
    Node("nic-across-socket", _across_socket, gpus=1, nearest=[("mlx5_0:1", Distance.SYS)]),
    Node(
        "no-rdma",
        lambda root: make_node(root, nics=0),
        gdr=False,
        reason="no RDMA devices in /sys/class/infiniband",
        nearest=[(None, None)] * 8,
    ),
    Node(
        "one-port-down",
        lambda root: make_node(root, down=[2]),
        # GPU 2 falls back to a NIC of its own socket, through the host bridge.
        nearest=[*PIX8[:2], ("mlx5_0:1", Distance.PHB), *PIX8[3:]],
        labels={contract.NODE_LABEL_RDMA_NICS: "7"},
    ),
    Node(
        "all-ports-down",
        lambda root: make_node(root, down=range(8)),
        gdr=False,
        reason="no active RDMA port",
        nearest=[(None, None)] * 8,
    ),
]


def _discover(node: Node, tmp_path: Path) -> NodeInventory:
    node.build(tmp_path)
    return discover(make_backend(node.gpus), tmp_path)


@pytest.mark.parametrize("node", NODES, ids=[node.id for node in NODES])
def test_discover(node: Node, tmp_path: Path) -> None:
    inventory = _discover(node, tmp_path)

    assert inventory.problems == ()
    assert len(inventory.gpus) == node.gpus
    assert inventory.gdr.possible is node.gdr
    assert node.reason in inventory.gdr.reason
    assert [(n.nic, n.distance) for n in inventory.nearest_nics] == node.nearest
    labels = build_labels(inventory, nvlink_domain="gpu-a")
    assert labels.items() >= node.labels.items()
    if not inventory.active_nics:
        assert contract.NODE_LABEL_RDMA not in labels


def test_healthy_node_reads_every_field(tmp_path: Path) -> None:
    inventory = _discover(NODES[0], tmp_path)

    gpu, nic = inventory.gpus[5], inventory.nics[0]
    assert (gpu.pci_bus_id, gpu.numa_node, gpu.memory_mib) == ("0000:60:00.0", 1, GPU_MEMORY_MIB)
    assert gpu.pci_path == "pci0000:80/0000:80:06.0/0000:61:00.0/0000:62:00.0/0000:60:00.0"
    assert (nic.hca, nic.state, nic.link_layer, nic.rate_gbps) == ("mlx5_0:1", "ACTIVE", "IB", 400)
    assert nic.numa_node == 0
    assert inventory.gdr.peer_memory == "nvidia_peermem"


def test_roce_gid_types(tmp_path: Path) -> None:
    port = add_nic(tmp_path, "mlx5_0", 0, link_layer="Ethernet", gid_types=ROCE_GIDS)
    write(port / "gid_attrs/types/7", "")  # an unpopulated slot reads empty: ignored
    inventory = discover(make_backend(0), tmp_path)

    assert inventory.nics[0].gid_types == tuple((int(i), kind) for i, kind in ROCE_GIDS.items())
    assert inventory.nics[0].roce_v2_gid_indices == (1, 3)


CHAIN = "pci0000:00/0000:00:01.0/0000:01:00.0"
DISTANCES = [
    ("pix-one-switch", f"{CHAIN}/0000:02:00.0/0000:03:00.0", 0, Distance.PIX),
    ("pxb-two-switch-levels", f"{CHAIN}/0000:02:04.0/0000:05:00.0/0000:06:00.0/x", 0, Distance.PXB),
    ("phb-other-root-port", "pci0000:00/0000:00:02.0/0000:09:00.0", 0, Distance.PHB),
    ("node-other-host-bridge", "pci0000:40/0000:40:01.0/0000:41:00.0", 0, Distance.NODE),
    ("sys-other-socket", "pci0000:80/0000:80:01.0/0000:81:00.0", 1, Distance.SYS),
    ("sys-when-numa-unknown", "pci0000:40/0000:40:01.0/0000:41:00.0", None, Distance.SYS),
    ("unknown-path", None, 0, None),
]


@pytest.mark.parametrize(
    ("nic_path", "numa", "expected"), [d[1:] for d in DISTANCES], ids=[d[0] for d in DISTANCES]
)
def test_pci_distance(nic_path: str | None, numa: int | None, expected: Distance | None) -> None:
    gpu = f"{CHAIN}/0000:02:01.0/0000:04:00.0"
    assert pci_distance(gpu, 0, nic_path, numa) == expected


ISLANDS = [
    (
        "two-islands-of-4",
        {"nvlinks": [(0, 1), (1, 2), (2, 3), (4, 5), (5, 6), (6, 7)]},
        ((0, 1, 2, 3), (4, 5, 6, 7)),
    ),
    ("one-nvswitch-island", {"switched": [range(8)]}, ((0, 1, 2, 3, 4, 5, 6, 7),)),
    ("two-switch-planes", {"switched": [range(4), range(4, 8)]}, ((0, 1, 2, 3), (4, 5, 6, 7))),
    ("pcie-only", {}, ()),
]


@pytest.mark.parametrize(
    ("links", "expected"), [i[1:] for i in ISLANDS], ids=[i[0] for i in ISLANDS]
)
def test_nvlink_islands(
    links: dict[str, list[object]], expected: tuple[tuple[int, ...], ...], tmp_path: Path
) -> None:
    make_node(tmp_path)
    inventory = discover(make_backend(8, **links), tmp_path)  # type: ignore[arg-type]
    assert inventory.nvlink_islands == expected


def _bad_port(file: str, text: str) -> Callable[[Path], None]:
    def build(root: Path) -> None:
        make_node(root, gpus=2, nics=2)
        write(root / "sys/class/infiniband/mlx5_1/ports/1" / file, text)

    return build


def _bad_numa(root: Path) -> None:
    make_node(root, gpus=2, nics=2)
    write(root / "sys/class/infiniband/mlx5_1/device/numa_node", "banana\n")


def _no_ports(root: Path) -> None:
    make_node(root, gpus=2, nics=2)
    (root / "sys/class/infiniband/mlx5_9").mkdir()


def _gpu_missing(root: Path) -> None:
    make_node(root, gpus=2, nics=2)
    (root / "sys/bus/pci/devices/0000:20:00.0").unlink()


MALFORMED = [
    ("garbled-state", _bad_port("state", "ACTIVE-ish"), "mlx5_1/ports/1/state: 'ACTIVE-ish", 1),
    ("unknown-link-layer", _bad_port("link_layer", "OmniPath"), "expected InfiniBand or", 1),
    ("unparsable-rate", _bad_port("rate", "fast"), "rate: 'fast', expected", 1),
    ("empty-state", _bad_port("state", ""), "state: '', expected e.g. '4: ACTIVE'", 1),
    ("non-integer-numa", _bad_numa, "numa_node: 'banana', expected an integer", 2),
    ("device-without-ports", _no_ports, "/sys/class/infiniband/mlx5_9: no ports", 2),
    ("gpu-not-in-sysfs", _gpu_missing, "GPU 0000:20:00.0 PCI locality unknown", 2),
]


@pytest.mark.parametrize(
    ("build", "problem", "nics"), [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED]
)
def test_malformed_files_are_skipped_with_a_reason(
    build: Callable[[Path], None], problem: str, nics: int, tmp_path: Path
) -> None:
    build(tmp_path)
    inventory = discover(make_backend(2), tmp_path)

    assert len(inventory.nics) == nics
    assert any(problem in text for text in inventory.problems), inventory.problems
    assert json.loads(build_annotations(inventory)[ANNOTATION_INVENTORY])["problems"]


def test_labels_match_the_simulated_node(tmp_path: Path) -> None:
    """A real HGX node and its kwok twin carry the same placement labels."""
    make_node(tmp_path)
    inventory = discover(make_backend(8), tmp_path)
    shape = NodeShape.model_validate(
        {
            "gpu": {"product": "NVIDIA-H100-80GB-HBM3", "count": 8, "memoryMiB": GPU_MEMORY_MIB},
            "rdma": {"nics": 8, "linkLayer": "IB", "rateGbps": 400},
        }
    )
    twin = build_node("c", "gpu-a", spine="s", rack="rack-00", position=0, shape=shape)
    wanted = {k: v for k, v in twin["metadata"]["labels"].items() if k.startswith("nvidia.com/")}
    wanted |= {
        contract.NODE_LABEL_RDMA: twin["metadata"]["labels"][contract.NODE_LABEL_RDMA],
        contract.NODE_LABEL_RDMA_NICS: twin["metadata"]["labels"][contract.NODE_LABEL_RDMA_NICS],
        contract.NODE_LABEL_GPUDIRECT: twin["metadata"]["labels"][contract.NODE_LABEL_GPUDIRECT],
        contract.NODE_LABEL_NVLINK_DOMAIN: "gpu-a",
    }

    assert build_labels(inventory, nvlink_domain="gpu-a") == wanted


def test_annotation_carries_the_full_inventory(tmp_path: Path) -> None:
    make_node(tmp_path, link_layer="Ethernet", gid_types=ROCE_GIDS)
    inventory = discover(make_backend(8, switched=[range(8)]), tmp_path)
    document = json.loads(build_annotations(inventory)[ANNOTATION_INVENTORY])

    assert document["nearestNic"]["3"] == {"hca": "mlx5_3:1", "distance": "PIX", "gdrInReach": True}
    assert document["nvlinkIslands"] == [list(range(8))]
    assert document["nics"][0]["gidTypes"] == ROCE_GIDS
    assert document["gdr"]["possible"] is True
    assert document["gpus"][0]["uuid"].startswith("GPU-")


def test_no_gpus_no_gpu_labels(tmp_path: Path) -> None:
    make_node(tmp_path, gpus=0, nics=2)
    assert build_labels(discover(make_backend(0), tmp_path), nvlink_domain="n") == {
        contract.NODE_LABEL_RDMA: "infiniband",
        contract.NODE_LABEL_RDMA_NICS: "2",
    }


def test_nvml_backend_without_pynvml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails as on a node without it
    with pytest.raises(GpuBackendError, match="install trainwave\\[agent\\]"):
        NvmlBackend().__enter__()
    with pytest.raises(GpuBackendError, match="outside"):
        NvmlBackend().count()


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("00000000:1A:00.0", "0000:1a:00.0"), ("0000:1a:00.0", "0000:1a:00.0")],
    ids=["nvml", "sysfs"],
)
def test_normalize_bus_id(raw: str, expected: str) -> None:
    assert normalize_bus_id(raw) == expected
