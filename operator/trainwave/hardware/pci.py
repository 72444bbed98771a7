"""PCI bus ids and the GPU<->NIC path type, the way `nvidia-smi topo -m` and NCCL name them.

NCCL uses GPUDirect RDMA only when a GPU reaches its NIC within
NCCL_NET_GDR_LEVEL, by default PXB (src/graph/paths.cc): a NIC behind the CPU
root complex (PHB) or another socket (SYS) silently stages every transfer
through host memory. The agent computes these distances to publish them; the
doctor computes them again inside the pod to check what NCCL will see.
"""

from __future__ import annotations

import enum
import os
from pathlib import Path


class Distance(enum.IntEnum):
    """GPU<->NIC path, best first; the names and meaning of `nvidia-smi topo -m` and NCCL."""

    PIX = 1  # at most one PCIe bridge (one switch) between them
    PXB = 2  # several PCIe bridges, not through the host bridge
    PHB = 3  # through the PCIe host bridge (the CPU root complex)
    NODE = 4  # between host bridges inside one NUMA node
    SYS = 5  # across the SMP interconnect between NUMA nodes (sockets)


# NCCL's default NCCL_NET_GDR_LEVEL.
GDR_MAX_DISTANCE = Distance.PXB


def normalize_bus_id(bus_id: str) -> str:
    """NVML writes `00000000:18:00.0`, sysfs `0000:18:00.0`: compare in the sysfs spelling."""
    text = bus_id.strip().lower()
    domain, sep, rest = text.partition(":")
    if not sep or not rest:
        raise ValueError(f"PCI bus id {bus_id!r}: expected domain:bus:device.function")
    try:
        return f"{int(domain, 16):04x}:{rest}"
    except ValueError:
        raise ValueError(f"PCI bus id {bus_id!r}: domain {domain!r} is not hexadecimal") from None


def pci_location(
    root: Path, link: Path, problems: list[str] | None = None
) -> tuple[str | None, int | None]:
    """A sysfs device link resolved to its path under <root>/sys/devices, and its NUMA node.

    `link` is `/sys/class/infiniband/<hca>/device` or `/sys/bus/pci/devices/<bus id>`.
    (None, None) for a device without a PCI function (soft RoCE, virtual NICs);
    what could not be read is appended to `problems` when given.
    """
    if not link.exists():
        return None, None
    devices = Path(os.path.realpath(root / "sys/devices"))
    target = Path(os.path.realpath(link))
    try:
        pci_path = target.relative_to(devices).as_posix()
    except ValueError:
        _note(
            problems,
            f"{shown(root, link)}: resolves to {target}, outside {devices}; PCI locality unknown",
        )
        return None, None
    return pci_path, _numa_node(root, target / "numa_node", problems)


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


def shown(root: Path, path: Path) -> str:
    """A path as it is on the node (/sys/...), whatever the root."""
    try:
        return "/" + path.relative_to(root).as_posix()
    except ValueError:
        return str(path)


def _numa_node(root: Path, path: Path, problems: list[str] | None) -> int | None:
    try:
        raw = path.read_text(errors="replace").strip()
    except OSError:
        return None
    try:
        value = int(raw)
    except ValueError:
        _note(problems, f"{shown(root, path)}: {raw!r}, expected an integer")
        return None
    return value if value >= 0 else None  # -1: the platform does not say


def _note(problems: list[str] | None, text: str) -> None:
    if problems is not None:
        problems.append(text)
