"""Fake node roots for the agent: sysfs and procfs trees under tmp_path, and fake GPUs.

The layout mirrors an HGX board: GPU i and NIC i share one PCIe switch under
root port i; pairs 0..3 sit on socket 0 (host bridge pci0000:00, NUMA 0), the
rest on socket 1 (pci0000:80, NUMA 1). Symlinks are relative, as on a real
node, so the agent's resolution runs unchanged.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from trainwave.agent.nvml import FakeGpuBackend, GpuDevice

GPU_PRODUCT = "NVIDIA H100 80GB HBM3"
GPU_MEMORY_MIB = 81559
OPEN_DRIVER = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.15  Release Build\n"
PROPRIETARY_DRIVER = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.161.08  Release Build\n"
ROCE_GIDS = {"0": "IB/RoCE v1", "1": "RoCE v2", "2": "IB/RoCE v1", "3": "RoCE v2"}


def gpu_bus_id(index: int) -> str:
    return f"0000:{index + 1:x}0:00.0"


def socket_of(pair: int, per_socket: int = 4) -> int:
    return 0 if pair < per_socket else 1


def switch_chain(pair: int, socket: int) -> list[str]:
    """Host bridge, root port and switch upstream port that pair `pair` hangs off."""
    bridge = "00" if socket == 0 else "80"
    return [f"pci0000:{bridge}", f"0000:{bridge}:{pair + 1:02x}.0", f"0000:{pair + 1:x}1:00.0"]


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def link(path: Path, target: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(os.path.relpath(target, path.parent))


def pci_device(root: Path, chain: Iterable[str], numa: int | str | None) -> Path:
    device = root.joinpath("sys/devices", *chain)
    device.mkdir(parents=True, exist_ok=True)
    if numa is not None:
        write(device / "numa_node", f"{numa}\n")
    return device


def add_gpu(root: Path, index: int, *, socket: int | None = None) -> None:
    socket = socket_of(index) if socket is None else socket
    chain = [*switch_chain(index, socket), f"0000:{index + 1:x}2:00.0", gpu_bus_id(index)]
    device = pci_device(root, chain, socket)
    link(root / "sys/bus/pci/devices" / gpu_bus_id(index), device)


def add_nic(
    root: Path,
    name: str,
    pair: int,
    *,
    socket: int | None = None,
    link_layer: str = "InfiniBand",
    state: str = "4: ACTIVE",
    rate: str = "400 Gb/sec (4X NDR)",
    gid_types: Mapping[str, str] | None = None,
    numa: int | str | None = "socket",
) -> Path:
    """One single-port RDMA device in the switch of pair `pair`; returns its port directory."""
    socket = socket_of(pair) if socket is None else socket
    chain = [*switch_chain(pair, socket), f"0000:{pair + 1:x}2:01.0", f"0000:{pair + 1:x}8:00.0"]
    device = pci_device(root, chain, socket if numa == "socket" else numa)
    base = root / "sys/class/infiniband" / name
    link(base / "device", device)
    port = base / "ports/1"
    write(port / "state", f"{state}\n")
    write(port / "link_layer", f"{link_layer}\n")
    write(port / "rate", f"{rate}\n")
    for index, kind in (gid_types or {}).items():
        write(port / "gid_attrs/types" / index, f"{kind}\n" if kind else "")
    return port


def make_node(
    root: Path,
    *,
    gpus: int = 8,
    nics: int = 8,
    link_layer: str = "InfiniBand",
    gid_types: Mapping[str, str] | None = None,
    peermem: str | None = "sysmodule",
    driver: str | None = PROPRIETARY_DRIVER,
    kernel: str = "5.15.0-105-generic",
    down: Iterable[int] = (),
) -> Path:
    """An HGX-like root: `gpus` GPUs, `nics` NICs (NIC i next to GPU i), a driver, modules.

    `peermem`: "sysmodule" (/sys/module/nvidia_peermem), "procmodules"
    (only a /proc/modules line), or None (not loaded).
    """
    for index in range(gpus):
        add_gpu(root, index)
    for pair in range(nics):
        add_nic(
            root,
            f"mlx5_{pair}",
            pair,
            link_layer=link_layer,
            gid_types=gid_types,
            state="1: DOWN" if pair in set(down) else "4: ACTIVE",
        )
    modules = "nvidia_uvm 4956160 0 - Live 0x0\nnvidia 54292480 1 nvidia_uvm, Live 0x0\n"
    if peermem == "sysmodule":
        write(root / "sys/module/nvidia_peermem/refcnt", "0\n")
    elif peermem == "procmodules":
        modules += "nvidia_peermem 16384 0 - Live 0x0\n"
    write(root / "proc/modules", modules)
    if driver is not None:
        write(root / "proc/driver/nvidia/version", driver)
    write(root / "proc/sys/kernel/osrelease", f"{kernel}\n")
    return root


def make_backend(
    gpus: int = 8,
    *,
    nvlinks: Iterable[tuple[int, int]] = (),
    switched: Iterable[Iterable[int]] = (),
) -> FakeGpuBackend:
    """`gpus` identical fake GPUs whose NVML bus ids match `make_node`'s tree."""
    devices = [
        GpuDevice(
            uuid=f"GPU-{index:08x}-0000-0000-0000-000000000000",
            name=GPU_PRODUCT,
            memory_mib=GPU_MEMORY_MIB,
            pci_bus_id="0000" + gpu_bus_id(index).upper(),  # NVML spelling: 00000000:10:00.0
        )
        for index in range(gpus)
    ]
    return FakeGpuBackend(devices, nvlinks=list(nvlinks), switched=[list(g) for g in switched])
