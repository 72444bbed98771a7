"""RDMA NICs and GPU PCI locality, read from a root directory.

Every reader takes `root` (the host's `/` mounted into the agent, or a fake
tree in tests), so tests run this parsing on files they wrote. Nothing here
raises on odd content: a file that cannot be read or parsed becomes a
`problems` entry naming the file, the value seen and what was expected.
"""

from __future__ import annotations

import re
from pathlib import Path

from trainwave.hardware.inventory import LinkLayer, NicInfo
from trainwave.hardware.pci import pci_location, shown

_LINK_LAYERS: dict[str, LinkLayer] = {"infiniband": "IB", "ethernet": "RoCE"}
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*Gb/sec")
_STATE = re.compile(r"^\s*\d+:\s*([A-Z_]+)\s*$")


def read_nics(root: Path) -> tuple[list[NicInfo], list[str]]:
    """Every port of every device under <root>/sys/class/infiniband, and what was skipped."""
    base = root / "sys/class/infiniband"
    nics: list[NicInfo] = []
    problems: list[str] = []
    if not base.is_dir():
        return nics, problems
    for device in sorted(base.iterdir()):
        pci_path, numa_node = pci_location(root, device / "device", problems)
        ports = device / "ports"
        if not ports.is_dir():
            problems.append(f"{shown(root, device)}: no ports directory; device skipped")
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


def read_gpu_location(
    root: Path, bus_id: str, problems: list[str]
) -> tuple[str | None, int | None]:
    """A GPU's PCI path and NUMA node from <root>/sys/bus/pci/devices/<bus id>."""
    link = root / "sys/bus/pci/devices" / bus_id
    if not link.exists():
        problems.append(f"{shown(root, link)}: missing; GPU {bus_id} PCI locality unknown")
        return None, None
    return pci_location(root, link, problems)


def _read_port(
    root: Path,
    name: str,
    port: Path,
    *,
    pci_path: str | None,
    numa_node: int | None,
    problems: list[str],
) -> NicInfo | None:
    where = shown(root, port)
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


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return None
