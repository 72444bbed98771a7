"""Whether a node can register GPU memory with an RDMA NIC: peer memory or DMA-BUF.

The agent asks on the host to label the node (trainwave.io/gpudirect-rdma);
the doctor asks inside the worker to confirm the label held. Both read files
under a root directory (the host's `/`, the container's `/`, or a test tree).
"""

from __future__ import annotations

import re
from pathlib import Path

# The modules NCCL's gdr.cc looks for; nv_mem is the peer-memory client they register.
PEER_MEMORY_MODULES = ("nvidia_peermem", "nv_peer_mem")
# DMA-BUF export of GPU memory needs the open GPU kernel modules from R515 and
# a kernel with dma-buf importer support for RDMA (5.12); see the GPU Operator
# RDMA docs cited in shared/research/runtime-and-rdma.md section 3.3.
DMABUF_MIN_DRIVER = 515
DMABUF_MIN_KERNEL = (5, 12)
_DRIVER_MAJOR = re.compile(r"\s(\d{3,})\.\d+(?:\.\d+)?\s")
_KERNEL = re.compile(r"^(\d+)\.(\d+)")


def peer_memory_module(root: Path) -> str | None:
    """The loaded peer-memory module NCCL would use, or None."""
    for module in PEER_MEMORY_MODULES:
        if (root / "sys/module" / module).is_dir():
            return module
    if (root / "sys/kernel/mm/memory_peers/nv_mem").is_dir():
        return "nv_peer_mem"
    for line in (_read(root / "proc/modules") or "").splitlines():
        name = line.split(" ", 1)[0]
        if name in PEER_MEMORY_MODULES:
            return name
    return None


def dmabuf_support(root: Path) -> tuple[bool, str]:
    """Whether the kernel side of DMA-BUF GPU memory registration is present, and why.

    A heuristic, stated as such: it checks the open GPU kernel modules, their
    version and the kernel release. User space (rdma-core >= 34 with
    ibv_reg_dmabuf_mr, NCCL >= 2.13) is invisible from here.
    """
    version = _read(root / "proc/driver/nvidia/version")
    if version is None:
        return False, "no NVIDIA driver (/proc/driver/nvidia/version missing)"
    if "Open Kernel Module" not in version:
        return False, "the proprietary NVIDIA kernel module cannot export DMA-BUF"
    major = _DRIVER_MAJOR.search(version)
    if major is None or int(major.group(1)) < DMABUF_MIN_DRIVER:
        seen = major.group(1) if major else "unknown"
        return False, f"NVIDIA driver {seen}; DMA-BUF needs R{DMABUF_MIN_DRIVER} or newer"
    release = (_read(root / "proc/sys/kernel/osrelease") or "").strip()
    kernel = _KERNEL.match(release)
    if kernel is None or (int(kernel.group(1)), int(kernel.group(2))) < DMABUF_MIN_KERNEL:
        wanted = ".".join(map(str, DMABUF_MIN_KERNEL))
        return False, f"kernel {release or 'unknown'}; DMA-BUF needs {wanted} or newer"
    return True, f"open kernel module R{major.group(1)} on kernel {release}"


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return None
