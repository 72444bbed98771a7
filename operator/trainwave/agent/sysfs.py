"""RDMA NICs, PCI locality and the GPUDirect memory path, read from a root directory.

Every reader takes `root` (the host's `/` mounted into the agent, or a fake
tree in tests), so tests run this parsing on files they wrote. Nothing here
raises on odd content: a file that cannot be read or parsed becomes a
`problems` entry naming the file, the value seen and what was expected.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from trainwave.agent.inventory import LinkLayer, NicInfo

_LINK_LAYERS: dict[str, LinkLayer] = {"infiniband": "IB", "ethernet": "RoCE"}
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*Gb/sec")
_STATE = re.compile(r"^\s*\d+:\s*([A-Z_]+)\s*$")
_DRIVER_MAJOR = re.compile(r"\s(\d{3,})\.\d+(?:\.\d+)?\s")
_PEER_MEMORY_MODULES = ("nvidia_peermem", "nv_peer_mem")
# DMA-BUF export of GPU memory needs the open GPU kernel modules from R515 and
# a kernel with dma-buf importer support for RDMA (5.12); see the GPU Operator
# RDMA docs cited in shared/research/runtime-and-rdma.md section 3.3.
DMABUF_MIN_DRIVER = 515
DMABUF_MIN_KERNEL = (5, 12)


def read_nics(root: Path) -> tuple[list[NicInfo], list[str]]:
    """Every port of every device under <root>/sys/class/infiniband, and what was skipped."""
    base = root / "sys/class/infiniband"
    nics: list[NicInfo] = []
    problems: list[str] = []
    if not base.is_dir():
        return nics, problems
    for device in sorted(base.iterdir()):
        pci_path, numa_node = read_pci_location(root, device / "device", problems)
        ports = device / "ports"
        if not ports.is_dir():
            problems.append(f"{_shown(root, device)}: no ports directory; device skipped")
            continue
        for port in sorted(ports.iterdir(), key=lambda path: path.name):
            nic = _read_port(
                root,
                device.name,
                port,
                pci_path=pci_path,
                numa_node=numa_node,
                problems=problems,
            )
            if nic is not None:
                nics.append(nic)
    return nics, problems


def read_pci_location(root: Path, link: Path, problems: list[str]) -> tuple[str | None, int | None]:
    """Resolve a sysfs device link to its path under <root>/sys/devices, and its NUMA node."""
    if not link.exists():
        return None, None  # soft RoCE (rxe) and virtual devices have no PCI function
    devices = (root / "sys/devices").resolve()
    target = Path(os.path.realpath(link))
    try:
        pci_path = target.relative_to(devices).as_posix()
    except ValueError:
        problems.append(
            f"{_shown(root, link)}: resolves to {target}, outside {devices}; PCI locality unknown"
        )
        return None, None
    numa_node = _read_numa(root, target / "numa_node", problems)
    return pci_path, numa_node


def read_gpu_location(
    root: Path, bus_id: str, problems: list[str]
) -> tuple[str | None, int | None]:
    """A GPU's PCI path and NUMA node from <root>/sys/bus/pci/devices/<bus id>."""
    link = root / "sys/bus/pci/devices" / bus_id
    if not link.exists():
        problems.append(f"{_shown(root, link)}: missing; GPU {bus_id} PCI locality unknown")
        return None, None
    return read_pci_location(root, link, problems)


def read_peer_memory(root: Path) -> str | None:
    """The loaded peer-memory module NCCL would use, as NCCL's gdr.cc looks for it."""
    for module in _PEER_MEMORY_MODULES:
        if (root / "sys/module" / module).is_dir():
            return module
    if (root / "sys/kernel/mm/memory_peers/nv_mem").is_dir():
        return "nv_peer_mem"
    modules = _read(root / "proc/modules")
    for line in (modules or "").splitlines():
        name = line.split(" ", 1)[0]
        if name in _PEER_MEMORY_MODULES:
            return name
    return None


def read_dmabuf(root: Path) -> tuple[bool, str]:
    """Whether the kernel side of DMA-BUF GPU memory registration is present, and why.

    A heuristic, stated as such: it checks the open GPU kernel modules, their
    version and the kernel release. User space (rdma-core >= 34 with
    ibv_reg_dmabuf_mr, NCCL >= 2.13) is invisible from here; the in-pod doctor
    confirms the path with a real registration.
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
    kernel = re.match(r"^(\d+)\.(\d+)", release)
    if kernel is None or (int(kernel.group(1)), int(kernel.group(2))) < DMABUF_MIN_KERNEL:
        wanted = ".".join(map(str, DMABUF_MIN_KERNEL))
        return False, f"kernel {release or 'unknown'}; DMA-BUF needs {wanted} or newer"
    return True, f"open kernel module R{major.group(1)} on kernel {release}"


def _read_port(
    root: Path,
    name: str,
    port: Path,
    *,
    pci_path: str | None,
    numa_node: int | None,
    problems: list[str],
) -> NicInfo | None:
    where = _shown(root, port)
    if not port.name.isdigit():
        problems.append(f"{where}: port {port.name!r} is not a number; skipped")
        return None
    raw_state, raw_layer, raw_rate = (
        (_read(port / file) or "").strip() for file in ("state", "link_layer", "rate")
    )
    state = _STATE.match(raw_state)
    layer = _LINK_LAYERS.get(raw_layer.lower())
    rate = _RATE.match(raw_rate)
    if state is None:
        problems.append(f"{where}/state: {raw_state!r}, expected e.g. '4: ACTIVE'; port skipped")
        return None
    if layer is None:
        problems.append(
            f"{where}/link_layer: {raw_layer!r}, expected InfiniBand or Ethernet; port skipped"
        )
        return None
    if rate is None:
        problems.append(f"{where}/rate: {raw_rate!r}, expected e.g. '400 Gb/sec'; port skipped")
        return None
    return NicInfo(
        name=name,
        port=int(port.name),
        state=state.group(1),
        link_layer=layer,
        rate_gbps=float(rate.group(1)),
        pci_path=pci_path,
        numa_node=numa_node,
        gid_types=_read_gid_types(port / "gid_attrs/types") if layer == "RoCE" else (),
    )


def _read_gid_types(types: Path) -> tuple[tuple[int, str], ...]:
    if not types.is_dir():
        return ()
    found: list[tuple[int, str]] = []
    for entry in types.iterdir():
        # Unpopulated GID slots fail to read (EINVAL) on real nodes: not a problem.
        kind = _read(entry)
        if entry.name.isdigit() and kind and kind.strip():
            found.append((int(entry.name), kind.strip()))
    return tuple(sorted(found))


def _read_numa(root: Path, path: Path, problems: list[str]) -> int | None:
    raw = _read(path)
    if raw is None:
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        problems.append(f"{_shown(root, path)}: {raw.strip()!r}, expected an integer")
        return None
    return value if value >= 0 else None  # -1: the platform does not say


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return None


def _shown(root: Path, path: Path) -> str:
    """A path as it is on the node (/sys/...), whatever the root."""
    try:
        return "/" + path.relative_to(root).as_posix()
    except ValueError:
        return str(path)
