"""Fake worker roots for the doctor: /dev, /sys and /proc trees under tmp_path.

`healthy_root` builds a worker that passes every check: GPU 0 and mlx5_0 on
one PCIe switch under socket 0, an ACTIVE RoCE port with a RoCE v2 GID,
nvidia_peermem loaded, memlock unlimited, 8 GiB /dev/shm, no IOMMU. Each
test then breaks one thing. Symlinks are relative, as on a real node.
"""

from __future__ import annotations

import os
from pathlib import Path

from trainwave.runtime.doctor import Host

GPU_BUS = "0000:18:00.0"
NIC_BUS = "0000:19:00.0"
FAR_GPU_BUS = "0000:98:00.0"
OPEN_DRIVER = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.15  Release Build\n"
PROPRIETARY_DRIVER = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.161.08  Release Build\n"
LIMITS_UNLIMITED = "Max locked memory         unlimited            unlimited            bytes\n"
LIMITS_8MIB = "Max locked memory         8388608              8388608              bytes\n"
CAPEFF_DEFAULT = "CapEff:\t00000000a80425fb\n"  # Docker's default set: no CAP_IPC_LOCK
CAPEFF_IPC_LOCK = "CapEff:\t00000000a80465fb\n"  # the same plus bit 14


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def link(path: Path, target: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(os.path.relpath(target, path.parent))


def pci_device(root: Path, *chain: str, numa: int = 0) -> Path:
    device = root.joinpath("sys/devices", *chain)
    device.mkdir(parents=True, exist_ok=True)
    write(device / "numa_node", f"{numa}\n")
    return device


def add_gpu(root: Path, bus: str, *chain: str, numa: int = 0) -> None:
    device = pci_device(root, *chain, bus, numa=numa)
    link(root / "sys/bus/pci/devices" / bus, device)
    (root / "proc/driver/nvidia/gpus" / bus).mkdir(parents=True, exist_ok=True)


def add_nic(
    root: Path,
    name: str,
    *chain: str,
    state: str = "4: ACTIVE",
    link_layer: str = "Ethernet",
    gid_types: dict[str, str] | None = None,
) -> Path:
    device = pci_device(root, *chain, NIC_BUS)
    base = root / "sys/class/infiniband" / name
    link(base / "device", device)
    port = base / "ports/1"
    write(port / "state", f"{state}\n")
    write(port / "link_layer", f"{link_layer}\n")
    write(port / "rate", "400 Gb/sec (4X NDR)\n")
    types = {"0": "IB/RoCE v1", "1": "RoCE v2"} if gid_types is None else gid_types
    for index, kind in types.items():
        write(port / "gid_attrs/types" / index, f"{kind}\n")
        write(port / "gids" / index, "0000:0000:0000:0000:0000:ffff:0a00:0001\n")
    return port


SWITCH = ("pci0000:00", "0000:00:01.0", "0000:11:00.0")


def healthy_root(root: Path) -> Path:
    add_gpu(root, GPU_BUS, *SWITCH, "0000:12:00.0")
    add_nic(root, "mlx5_0", *SWITCH, "0000:12:01.0")
    write(root / "dev/infiniband/uverbs0", "")
    (root / "sys/module/nvidia_peermem").mkdir(parents=True)
    write(root / "proc/driver/nvidia/version", PROPRIETARY_DRIVER)
    write(root / "proc/self/limits", LIMITS_UNLIMITED)
    write(root / "proc/self/status", CAPEFF_DEFAULT)
    write(root / "proc/self/mounts", "shm /dev/shm tmpfs rw,nosuid,nodev,size=8g 0 0\n")
    write(root / "proc/cmdline", "BOOT_IMAGE=/vmlinuz root=/dev/sda1\n")
    (root / "sys/class/iommu").mkdir(parents=True)
    return root


def host(root: Path, **environ: str) -> Host:
    return Host(root=root, environ=environ)
