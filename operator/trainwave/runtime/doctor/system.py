"""Host checks for GPUDirect: peer memory, memlock, /dev/shm, IOMMU."""

from __future__ import annotations

import os
import re

from trainwave.hardware.gpudirect import dmabuf_support, peer_memory_module
from trainwave.runtime.doctor.host import Host
from trainwave.runtime.doctor.rdma import NO_RDMA
from trainwave.runtime.doctor.report import Check, failed, passed, skipped, warned

CAP_IPC_LOCK = 14
# NCCL's SHM transport and DataLoader workers live in /dev/shm; Docker's 64 MiB
# default crashes NCCL (ncclShmOpen) as soon as a few ranks share a node.
SHM_FAIL_BYTES = 256 << 20
SHM_WARN_BYTES = 1 << 30
_SIZE = re.compile(r"^(\d+)([kmg]?)$", re.IGNORECASE)


def check_peer_memory(host: Host) -> Check:
    """The node agent's GPUDirect check (trainwave.hardware.gpudirect), run again in the pod."""
    name = "peer_memory"
    if not host.gpu_bus_ids():
        return skipped(name, "no NVIDIA GPU visible")
    if not host.expects_rdma():
        return skipped(name, NO_RDMA)
    module = peer_memory_module(host.root)
    if module is not None:
        return passed(name, f"peer-memory module {module} loaded")
    dmabuf, why = dmabuf_support(host.root)
    if dmabuf:
        return passed(name, f"DMA-BUF path available: {why}")
    return failed(
        name,
        f"no nvidia_peermem/nv_peer_mem module and no DMA-BUF path ({why}): NCCL stages "
        "every transfer through host memory; load nvidia-peermem or use the open kernel modules",
    )


def check_memlock(host: Host) -> Check:
    """RDMA pins registered buffers: an unlimited memlock or CAP_IPC_LOCK is needed."""
    name = "memlock"
    limit = _memlock_soft_limit(host.read("proc/self/limits"))
    capeff = _capeff(host.read("proc/self/status"))
    ipc_lock = capeff is not None and bool(capeff >> CAP_IPC_LOCK & 1)
    details = {"memlock_soft": limit, "cap_ipc_lock": ipc_lock}
    if limit == "unlimited":
        return passed(name, "RLIMIT_MEMLOCK is unlimited", **details)
    if ipc_lock:
        return passed(name, f"CAP_IPC_LOCK held (memlock limit {limit} bytes does not apply)")
    if not host.expects_rdma():
        return skipped(name, NO_RDMA, **details)
    return failed(
        name,
        f"RLIMIT_MEMLOCK is {limit} bytes and CAP_IPC_LOCK is not held: RDMA memory "
        "registration fails; add capabilities IPC_LOCK to the container or raise the limit",
        **details,
    )


def _memlock_soft_limit(limits: str | None) -> str:
    for line in (limits or "").splitlines():
        if line.startswith("Max locked memory"):
            fields = line.removeprefix("Max locked memory").split()
            return fields[0] if fields else "unknown"
    return "unknown"


def _capeff(status: str | None) -> int | None:
    for line in (status or "").splitlines():
        if line.startswith("CapEff:"):
            try:
                return int(line.split(":", 1)[1].strip(), 16)
            except ValueError:
                return None
    return None


def check_shm(host: Host) -> Check:
    name = "dev_shm"
    size = shm_size(host)
    if size is None:
        return warned(name, "/dev/shm not found: NCCL SHM and DataLoader workers need it")
    shown = f"{size / (1 << 20):.0f} MiB"
    if size < SHM_FAIL_BYTES:
        return failed(
            name,
            f"/dev/shm is {shown} (< {SHM_FAIL_BYTES >> 20} MiB): NCCL's SHM transport and "
            "DataLoader workers crash; mount an emptyDir with medium: Memory",
            bytes=size,
        )
    if size < SHM_WARN_BYTES:
        return warned(name, f"/dev/shm is {shown}; >= 1 GiB is advised", bytes=size)
    return passed(name, f"/dev/shm is {shown}", bytes=size)


def shm_size(host: Host) -> int | None:
    """The size= of the /dev/shm mount, else the size of the filesystem behind it."""
    for line in (host.read("proc/self/mounts") or "").splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[1] == "/dev/shm":
            for option in fields[3].split(","):
                if option.startswith("size="):
                    parsed = _parse_size(option.removeprefix("size="))
                    if parsed is not None:
                        return parsed
    shm = host.path("dev/shm")
    if not shm.is_dir():
        return None
    stats = os.statvfs(shm)
    return stats.f_frsize * stats.f_blocks


def _parse_size(text: str) -> int | None:
    match = _SIZE.match(text)
    if match is None:
        return None
    shift = {"": 0, "k": 10, "m": 20, "g": 30}[match.group(2).lower()]
    return int(match.group(1)) << shift


def check_iommu(host: Host) -> Check:
    name = "iommu"
    groups = host.path("sys/class/iommu")
    active = groups.is_dir() and any(groups.iterdir())
    cmdline = (host.read("proc/cmdline") or "").split()
    if not active:
        return passed(name, "no IOMMU active: peer-to-peer DMA is not remapped")
    if "iommu=pt" in cmdline or "iommu.passthrough=1" in cmdline:
        return passed(name, "IOMMU in passthrough mode (iommu=pt)")
    return warned(
        name,
        "IOMMU translates DMA (no iommu=pt on the kernel command line): GPU<->NIC peer "
        "traffic is remapped or blocked on bare metal; use iommu=pt (VMs need ATS and ACS set up)",
        cmdline=" ".join(cmdline),
    )
