"""One node's inventory from a GPU backend and a root directory.

`discover` is the only entry point: it asks the backend for GPUs and NVLinks,
reads NICs and the GPUDirect path from sysfs under `root`, and derives NVLink
islands and each GPU's nearest NIC. Reads files; no network, no Kubernetes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from trainwave.agent import sysfs
from trainwave.agent.nvml import GpuBackend
from trainwave.hardware.gpudirect import dmabuf_support, peer_memory_module
from trainwave.hardware.inventory import (
    GdrReadiness,
    GpuInfo,
    GpuNicDistance,
    NicInfo,
    NodeInventory,
)
from trainwave.hardware.pci import normalize_bus_id, pci_distance


def discover(backend: GpuBackend, root: Path = Path("/")) -> NodeInventory:
    problems: list[str] = []
    gpus: list[GpuInfo] = []
    links: dict[str, set[str]] = {}
    for index in range(backend.count()):
        device = backend.device(index)
        bus_id = normalize_bus_id(device.pci_bus_id)
        pci_path, numa_node = sysfs.read_gpu_location(root, bus_id, problems)
        gpus.append(
            GpuInfo(
                index=index,
                uuid=device.uuid,
                product=device.name,
                memory_mib=device.memory_mib,
                pci_bus_id=bus_id,
                numa_node=numa_node,
                pci_path=pci_path,
            )
        )
        links[bus_id] = {normalize_bus_id(peer) for peer in backend.nvlink_peers(index)}
    nics, nic_problems = sysfs.read_nics(root)
    problems += nic_problems
    return NodeInventory(
        gpus=tuple(gpus),
        nvlink_islands=nvlink_islands({gpu.pci_bus_id: gpu.index for gpu in gpus}, links),
        nics=tuple(nics),
        nearest_nics=tuple(nearest_nic(gpu, nics) for gpu in gpus),
        gdr=gdr_readiness(root, nics),
        problems=tuple(problems),
    )


def nvlink_islands(
    gpu_of_bus: Mapping[str, int], links: Mapping[str, Iterable[str]]
) -> tuple[tuple[int, ...], ...]:
    """Connected components of the NVLink graph, as sorted GPU indices.

    The graph holds every far end NVML reports, NVSwitches included, so GPUs
    that reach each other only through a switch still share an island.
    """
    parent: dict[str, str] = {}

    def find(node: str) -> str:
        parent.setdefault(node, node)
        while parent[node] != node:
            parent[node] = parent[parent[node]]
            node = parent[node]
        return node

    for near, fars in links.items():
        for far in fars:
            parent[find(near)] = find(far)
    groups: dict[str, list[int]] = {}
    for bus_id, index in gpu_of_bus.items():
        if links.get(bus_id):
            groups.setdefault(find(bus_id), []).append(index)
    return tuple(sorted(tuple(sorted(group)) for group in groups.values()))


def nearest_nic(gpu: GpuInfo, nics: Sequence[NicInfo]) -> GpuNicDistance:
    """The closest ACTIVE port; ties go to the first by name, as NCCL lists devices."""
    candidates = [
        (distance, nic)
        for nic in nics
        if nic.active
        and (distance := pci_distance(gpu.pci_path, gpu.numa_node, nic.pci_path, nic.numa_node))
        is not None
    ]
    if not candidates:
        return GpuNicDistance(gpu.index, None, None)
    distance, nic = min(candidates, key=lambda candidate: (candidate[0], candidate[1].hca))
    return GpuNicDistance(gpu.index, nic.hca, distance)


def gdr_readiness(root: Path, nics: Sequence[NicInfo]) -> GdrReadiness:
    """GPUDirect RDMA needs an active RDMA port and a way to register GPU memory with it."""
    peer_memory = peer_memory_module(root)
    dmabuf, dmabuf_why = dmabuf_support(root)
    if not any(nic.active for nic in nics):
        reason = "no active RDMA port" if nics else "no RDMA devices in /sys/class/infiniband"
        return GdrReadiness(False, peer_memory, dmabuf, reason)
    if peer_memory is not None:
        return GdrReadiness(True, peer_memory, dmabuf, f"peer memory module {peer_memory} loaded")
    if dmabuf:
        return GdrReadiness(True, None, True, f"DMA-BUF: {dmabuf_why}")
    reason = f"no peer memory module (nvidia_peermem) loaded and no DMA-BUF path: {dmabuf_why}"
    return GdrReadiness(False, None, False, reason)
