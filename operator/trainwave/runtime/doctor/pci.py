"""GPU<->NIC PCI distance, the way NCCL decides whether to use GPUDirect RDMA.

NCCL uses GDR only when a GPU reaches its NIC within NCCL_NET_GDR_LEVEL,
by default PXB (src/graph/paths.cc): a NIC behind the CPU root complex (PHB)
or another socket (SYS) silently stages every transfer through host memory.
"""

from __future__ import annotations

from trainwave.contract import ENV_NCCL_IB_HCA, ENV_NCCL_NET_GDR_LEVEL
from trainwave.hardware.pci import GDR_MAX_DISTANCE, Distance, pci_distance, pci_location
from trainwave.runtime.doctor.host import Host
from trainwave.runtime.doctor.rdma import NO_RDMA, HcaFilter, read_ports
from trainwave.runtime.doctor.report import Check, passed, skipped, warned

DEFAULT_GDR_LEVEL = GDR_MAX_DISTANCE
# NCCL_NET_GDR_LEVEL also takes the numbers of older releases.
_LEVEL_NUMBERS = {"0": None, "1": Distance.PIX, "2": Distance.PXB, "3": Distance.PHB}
_LEVEL_NUMBERS["4"] = Distance.SYS
_LEVEL_NUMBERS["5"] = Distance.SYS


def gdr_level(host: Host) -> Distance | None:
    """The configured NCCL_NET_GDR_LEVEL (None: GDR disabled outright)."""
    raw = host.env(ENV_NCCL_NET_GDR_LEVEL)
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
    wanted = host.env(ENV_NCCL_IB_HCA)
    if wanted:
        ports = HcaFilter.parse(wanted).select(ports)
    if not ports:
        return skipped(name, NO_RDMA)
    nics = {
        port.device: pci_location(
            host.root, host.path(f"sys/class/infiniband/{port.device}/device")
        )
        for port in ports
    }
    level = gdr_level(host)
    nearest: dict[str, str] = {}
    too_far: list[str] = []
    for bus in gpus:
        gpu = pci_location(host.root, host.path(f"sys/bus/pci/devices/{bus}"))
        if gpu[0] is None:
            nearest[bus] = "unknown (GPU not in sysfs)"
            too_far.append(bus)
            continue
        ranked = sorted(
            (found, device)
            for device, (path, numa) in nics.items()
            if (found := pci_distance(gpu[0], gpu[1], path, numa)) is not None
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
