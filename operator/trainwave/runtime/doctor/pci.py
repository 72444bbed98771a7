"""GPU<->NIC PCI distance, the way NCCL decides whether to use GPUDirect RDMA.

NCCL uses GDR only when a GPU reaches its NIC within NCCL_NET_GDR_LEVEL,
by default PXB (src/graph/paths.cc): a NIC behind the CPU root complex (PHB)
or another socket (SYS) silently stages every transfer through host memory.
"""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass
from pathlib import Path

from trainwave.runtime.doctor.host import Host
from trainwave.runtime.doctor.rdma import NO_RDMA, HcaFilter, read_ports
from trainwave.runtime.doctor.report import Check, passed, skipped, warned


class Distance(enum.IntEnum):
    """nvidia-smi topo / NCCL path types between two PCI devices, nearest first."""

    PIX = 1  # one PCIe switch between them
    PXB = 2  # several PCIe bridges, not through the host bridge
    PHB = 3  # through the PCIe host bridge (the CPU root complex)
    NODE = 4  # between host bridges inside one NUMA node
    SYS = 5  # across the SMP interconnect between sockets


DEFAULT_GDR_LEVEL = Distance.PXB
# NCCL_NET_GDR_LEVEL also takes the numbers of older releases.
_LEVEL_NUMBERS = {"0": None, "1": Distance.PIX, "2": Distance.PXB, "3": Distance.PHB}
_LEVEL_NUMBERS["4"] = Distance.SYS
_LEVEL_NUMBERS["5"] = Distance.SYS


@dataclass(frozen=True)
class PciLocation:
    path: tuple[str, ...]  # components under /sys/devices: pci0000:00, bridges..., device
    numa: int | None


def locate(host: Host, link: Path) -> PciLocation | None:
    """Resolve a sysfs device link (…/device or /sys/bus/pci/devices/<bdf>) to its PCI path."""
    if not link.exists():
        return None
    devices = Path(os.path.realpath(host.path("sys/devices")))
    target = Path(os.path.realpath(link))
    try:
        parts = target.relative_to(devices).parts
    except ValueError:
        return None
    numa_text = (host.read(target / "numa_node") or "").strip()
    numa = int(numa_text) if numa_text.lstrip("-").isdigit() and int(numa_text) >= 0 else None
    return PciLocation(parts, numa)


def distance(gpu: PciLocation, nic: PciLocation) -> Distance:
    """The path type between two devices; unknown NUMA across root complexes counts as SYS."""
    if gpu.path[0] != nic.path[0]:
        same_node = gpu.numa is not None and gpu.numa == nic.numa
        return Distance.NODE if same_node else Distance.SYS
    shared = 0
    for gpu_hop, nic_hop in zip(gpu.path[1:], nic.path[1:], strict=False):
        if gpu_hop != nic_hop:
            break
        shared += 1
    if shared == 0:
        return Distance.PHB  # different root ports of one host bridge
    # A switch is an upstream port plus a downstream port per device: devices
    # that part at most two levels above themselves hang off the same switch.
    below = max(len(gpu.path), len(nic.path)) - 1 - shared
    return Distance.PIX if below <= 2 else Distance.PXB


def gdr_level(host: Host) -> Distance | None:
    """The configured NCCL_NET_GDR_LEVEL (None: GDR disabled outright)."""
    raw = host.env("NCCL_NET_GDR_LEVEL")
    if raw is None:
        return DEFAULT_GDR_LEVEL
    if raw in _LEVEL_NUMBERS:
        return _LEVEL_NUMBERS[raw]
    if raw.upper() == "LOC":
        return None
    try:
        return Distance[raw.upper()]
    except KeyError:
        return DEFAULT_GDR_LEVEL  # NCCL ignores values it cannot parse


def check_gpu_nic_distance(host: Host) -> Check:
    name = "gpu_nic_distance"
    gpus = host.gpu_bus_ids()
    if not gpus:
        return skipped(name, "no NVIDIA GPU visible")
    ports = read_ports(host)
    wanted = host.env("NCCL_IB_HCA")
    if wanted:
        ports = HcaFilter.parse(wanted).select(ports)
    if not ports:
        return skipped(name, NO_RDMA)
    nics = {
        port.device: locate(host, host.path(f"sys/class/infiniband/{port.device}/device"))
        for port in ports
    }
    level = gdr_level(host)
    nearest: dict[str, str] = {}
    too_far: list[str] = []
    for bus in gpus:
        gpu = locate(host, host.path(f"sys/bus/pci/devices/{bus}"))
        if gpu is None:
            nearest[bus] = "unknown (GPU not in sysfs)"
            too_far.append(bus)
            continue
        ranked = sorted(
            (distance(gpu, where), device) for device, where in nics.items() if where is not None
        )
        if not ranked:
            nearest[bus] = "unknown (NICs have no PCI function)"
            too_far.append(bus)
            continue
        best, device = ranked[0]
        nearest[bus] = f"{device} {best.name}"
        if level is None or best > level:
            too_far.append(bus)
    allowed = "LOC (GDR off)" if level is None else level.name
    if too_far:
        return warned(
            name,
            f"GPU(s) {too_far} have no NIC within NCCL_NET_GDR_LEVEL={allowed}: NCCL stages "
            "their traffic through host memory",
            nearest=nearest,
        )
    return passed(name, f"every GPU has a NIC within {allowed}", nearest=nearest)
