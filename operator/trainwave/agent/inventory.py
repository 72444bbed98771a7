"""What one node holds: GPUs, RDMA NICs, NVLink islands, GPU<->NIC distances, GDR readiness.

Pure: small frozen dataclasses and the PCI distance rule. Discovery fills them
(`discovery.py`), labels read them (`labels.py`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Literal

LinkLayer = Literal["IB", "RoCE"]


class Distance(enum.IntEnum):
    """GPU<->NIC path, best first; the names and meaning of `nvidia-smi topo -m` and NCCL.

    NCCL uses GPUDirect RDMA only up to NCCL_NET_GDR_LEVEL, by default PXB: a
    NIC at PHB or worse silently stages through host memory.
    """

    PIX = 1  # at most one PCIe bridge (one switch) between them
    PXB = 2  # several PCIe bridges, not through the host bridge
    PHB = 3  # through the PCIe host bridge (the CPU root complex)
    NODE = 4  # between host bridges inside one NUMA node
    SYS = 5  # across the SMP interconnect between NUMA nodes (sockets)


GDR_MAX_DISTANCE = Distance.PXB


@dataclass(frozen=True)
class GpuInfo:
    index: int
    uuid: str
    product: str
    memory_mib: int
    pci_bus_id: str  # sysfs spelling: 0000:18:00.0
    numa_node: int | None
    pci_path: str | None = None  # under /sys/devices, e.g. pci0000:17/0000:17:01.0/0000:18:00.0


@dataclass(frozen=True)
class NicInfo:
    """One port of one RDMA device (`mlx5_0` port 1)."""

    name: str
    port: int
    state: str  # ACTIVE, DOWN, INIT, ARMED, ...
    link_layer: LinkLayer
    rate_gbps: float
    pci_path: str | None
    numa_node: int | None
    gid_types: tuple[tuple[int, str], ...] = ()  # (gid index, "RoCE v2" | "IB/RoCE v1")

    @property
    def hca(self) -> str:
        """The NCCL_IB_HCA spelling."""
        return f"{self.name}:{self.port}"

    @property
    def active(self) -> bool:
        return self.state == "ACTIVE"

    @property
    def roce_v2_gid_indices(self) -> tuple[int, ...]:
        return tuple(index for index, kind in self.gid_types if kind == "RoCE v2")


@dataclass(frozen=True)
class GpuNicDistance:
    """The nearest active NIC of one GPU; `nic` is None when there is none to reach."""

    gpu_index: int
    nic: str | None
    distance: Distance | None

    @property
    def gdr_in_reach(self) -> bool:
        return self.distance is not None and self.distance <= GDR_MAX_DISTANCE


@dataclass(frozen=True)
class GdrReadiness:
    """Whether a GPU memory registration path for RDMA exists on the node."""

    possible: bool
    peer_memory: str | None  # the module that provides it: nvidia_peermem, nv_peer_mem
    dmabuf: bool
    reason: str


@dataclass(frozen=True)
class NodeInventory:
    gpus: tuple[GpuInfo, ...]
    nvlink_islands: tuple[tuple[int, ...], ...]  # GPU indices; only GPUs with a link
    nics: tuple[NicInfo, ...]
    nearest_nics: tuple[GpuNicDistance, ...]
    gdr: GdrReadiness
    problems: tuple[str, ...] = ()  # what was skipped while reading, and why

    @property
    def active_nics(self) -> tuple[NicInfo, ...]:
        return tuple(nic for nic in self.nics if nic.active)


def normalize_bus_id(bus_id: str) -> str:
    """NVML writes `00000000:18:00.0`, sysfs `0000:18:00.0`: compare in the sysfs spelling."""
    text = bus_id.strip().lower()
    domain, sep, rest = text.partition(":")
    if not sep or not rest:
        raise ValueError(f"PCI bus id {bus_id!r}: expected domain:bus:device.function")
    return f"{int(domain, 16):04x}:{rest}"


def pci_distance(
    gpu_path: str | None, gpu_numa: int | None, nic_path: str | None, nic_numa: int | None
) -> Distance | None:
    """The path between two devices from their sysfs PCI paths and NUMA nodes.

    A path is `pci<domain:bus>/<bridge>/.../<device>` under /sys/devices. As in
    `nvidia-smi topo -m`, a PCIe switch (its upstream port and downstream ports)
    counts as one bridge: two devices whose paths part at most one level above
    each of them hang off the same switch (PIX). Different root complexes are
    NODE when both NUMA nodes are known and equal, else SYS: unknown locality
    is reported as the worse case, since it only ever disqualifies GDR.
    Returns None when a path is unknown (virtual NIC, GPU not in sysfs).
    """
    if gpu_path is None or nic_path is None:
        return None
    gpu_root, *gpu_chain = gpu_path.split("/")
    nic_root, *nic_chain = nic_path.split("/")
    if gpu_root != nic_root:
        same_node = gpu_numa is not None and gpu_numa >= 0 and gpu_numa == nic_numa
        return Distance.NODE if same_node else Distance.SYS
    shared = 0
    for gpu_hop, nic_hop in zip(gpu_chain, nic_chain, strict=False):
        if gpu_hop != nic_hop:
            break
        shared += 1
    if shared == 0:
        return Distance.PHB  # different root ports of one host bridge
    below = max(len(gpu_chain), len(nic_chain)) - shared
    return Distance.PIX if below <= 2 else Distance.PXB
