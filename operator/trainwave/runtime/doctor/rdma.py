"""RDMA checks: devices in the pod, HCA ports, RoCE GID type, NCCL's network variables."""

from __future__ import annotations

import re
from dataclasses import dataclass

from trainwave.contract import (
    ENV_NCCL_IB_DISABLE,
    ENV_NCCL_IB_GID_INDEX,
    ENV_NCCL_IB_HCA,
    ENV_NCCL_NET,
    ENV_NCCL_NET_GDR_LEVEL,
)
from trainwave.runtime.doctor.host import Host
from trainwave.runtime.doctor.report import Check, failed, passed, skipped, warned

_STATE = re.compile(r"^\s*\d+:\s*([A-Z_]+)")
_ZERO_GID = re.compile(r"^[0:]+$")
NO_RDMA = "no RDMA device in the pod and NCCL_IB_HCA unset: NCCL uses TCP sockets"


@dataclass(frozen=True)
class Port:
    device: str
    port: int
    state: str  # ACTIVE, DOWN, INIT, ...
    link_layer: str  # InfiniBand or Ethernet (RoCE)
    rate: str

    @property
    def hca(self) -> str:
        return f"{self.device}:{self.port}"


def read_ports(host: Host) -> list[Port]:
    ports: list[Port] = []
    for device in host.ib_devices():
        base = host.path(f"sys/class/infiniband/{device}/ports")
        if not base.is_dir():
            continue
        for entry in sorted(base.iterdir(), key=lambda path: path.name):
            if not entry.name.isdigit():
                continue
            state = _STATE.match(host.read(entry / "state") or "")
            ports.append(
                Port(
                    device=device,
                    port=int(entry.name),
                    state=state.group(1) if state else "UNKNOWN",
                    link_layer=(host.read(entry / "link_layer") or "unknown").strip(),
                    rate=(host.read(entry / "rate") or "unknown").strip(),
                )
            )
    return ports


@dataclass(frozen=True)
class HcaFilter:
    """NCCL_IB_HCA: prefixes, `=` for exact names, `^` to exclude, `:port` optional."""

    exact: bool
    exclude: bool
    entries: tuple[tuple[str, int | None], ...]

    @classmethod
    def parse(cls, text: str) -> HcaFilter:
        exclude = text.startswith("^")
        text = text.removeprefix("^")
        exact = text.startswith("=")
        text = text.removeprefix("=")
        entries: list[tuple[str, int | None]] = []
        for item in filter(None, (part.strip() for part in text.split(","))):
            name, _, port = item.partition(":")
            entries.append((name, int(port) if port.isdigit() else None))
        return cls(exact, exclude, tuple(entries))

    def matches(self, entry: tuple[str, int | None], port: Port) -> bool:
        name, number = entry
        named = port.device == name if self.exact else port.device.startswith(name)
        return named and (number is None or number == port.port)

    def select(self, ports: list[Port]) -> list[Port]:
        hit = [p for p in ports if any(self.matches(entry, p) for entry in self.entries)]
        return [p for p in ports if p not in hit] if self.exclude else hit


def check_rdma_devices(host: Host) -> Check:
    name = "rdma_devices"
    uverbs = sorted(p.name for p in host.path("dev/infiniband").glob("uverbs*"))
    if uverbs:
        return passed(name, f"{len(uverbs)} verbs device(s) in /dev/infiniband", devices=uverbs)
    if not host.expects_rdma():
        return skipped(name, NO_RDMA)
    return failed(
        name,
        "no /dev/infiniband/uverbs* in the container although RDMA is expected "
        f"(NCCL_IB_HCA={host.env('NCCL_IB_HCA')!r}, HCAs {list(host.ib_devices())}): "
        "the pod needs an RDMA device resource (e.g. rdma/rdma_shared_device_a)",
    )


def check_hca_ports(host: Host) -> Check:
    name = "hca_ports"
    ports = read_ports(host)
    wanted = host.env(ENV_NCCL_IB_HCA)
    if not ports:
        if wanted:
            return failed(name, f"NCCL_IB_HCA={wanted!r} but /sys/class/infiniband is empty")
        return skipped(name, NO_RDMA)
    seen = [f"{p.hca} {p.state} {p.link_layer} {p.rate}" for p in ports]
    if wanted:
        hca_filter = HcaFilter.parse(wanted)
        if not hca_filter.exclude:
            missing = [
                f"{n}:{p}" if p else n
                for n, p in hca_filter.entries
                if not any(hca_filter.matches((n, p), port) for port in ports)
            ]
            if missing:
                return failed(
                    name,
                    f"NCCL_IB_HCA={wanted!r} names {missing}, not present in this pod",
                    ports=seen,
                )
        ports = hca_filter.select(ports)
    active = [p for p in ports if p.state == "ACTIVE"]
    if not active:
        return failed(name, "no ACTIVE port among the HCAs NCCL will use", ports=seen)
    if len(active) < len(ports):
        down = [p.hca for p in ports if p.state != "ACTIVE"]
        return warned(name, f"ports not ACTIVE: {down}; NCCL skips them", ports=seen)
    return passed(name, f"{len(active)} ACTIVE port(s): {[p.hca for p in active]}", ports=seen)


def check_roce_gid(host: Host) -> Check:
    """RoCE needs a RoCE v2 GID (routable); NCCL < 2.21 uses index 0 unless told otherwise."""
    name = "roce_gid"
    roce = [p for p in read_ports(host) if p.link_layer.lower() == "ethernet"]
    if not roce:
        return skipped(name, "no RoCE (Ethernet link layer) port")
    chosen = host.env(ENV_NCCL_IB_GID_INDEX)
    # -1 (or unset) lets NCCL >= 2.21 pick a RoCE v2 GID itself.
    fixed = int(chosen) if chosen is not None and chosen.isdigit() else None
    problems: list[str] = []
    found: dict[str, list[int]] = {}
    for port in roce:
        v2 = _roce_v2_indices(host, port)
        found[port.hca] = v2
        if not v2:
            problems.append(f"{port.hca} has no RoCE v2 GID with an address")
        elif fixed is not None and fixed not in v2:
            problems.append(f"{port.hca}: NCCL_IB_GID_INDEX={chosen} is not RoCE v2 ({v2} are)")
    if problems:
        return failed(name, "; ".join(problems), roce_v2_indices=found)
    if fixed is None:
        return passed(
            name,
            "RoCE v2 GIDs present; NCCL >= 2.21 selects one itself, older NCCL needs "
            f"NCCL_IB_GID_INDEX set to one of {found}",
            roce_v2_indices=found,
        )
    return passed(name, f"NCCL_IB_GID_INDEX={chosen} is RoCE v2 on every port", indices=found)


def _roce_v2_indices(host: Host, port: Port) -> list[int]:
    base = host.path(f"sys/class/infiniband/{port.device}/ports/{port.port}")
    types = base / "gid_attrs/types"
    indices: list[int] = []
    if not types.is_dir():
        return indices
    for entry in sorted(types.iterdir(), key=lambda path: path.name.zfill(8)):
        if not entry.name.isdigit():
            continue
        kind = (host.read(entry) or "").strip()  # unset entries fail to read (EINVAL)
        gid = (host.read(base / "gids" / entry.name) or "").strip()
        if kind.lower() == "roce v2" and gid and not _ZERO_GID.match(gid):
            indices.append(int(entry.name))
    return indices


def check_nccl_env(host: Host) -> Check:
    """Variables that silently turn RDMA off, left over from debugging or a base image."""
    name = "nccl_env"
    if not host.expects_rdma():
        return skipped(name, NO_RDMA)
    problems = []
    if host.env(ENV_NCCL_IB_DISABLE) == "1":
        problems.append("NCCL_IB_DISABLE=1 forces TCP sockets")
    net = host.env(ENV_NCCL_NET)
    if net is not None and net.lower() == "socket":
        problems.append("NCCL_NET=Socket forces TCP sockets")
    if problems:
        return failed(name, "; ".join(problems) + "; unset it to use RDMA")
    if host.env(ENV_NCCL_NET_GDR_LEVEL) in ("LOC", "0"):
        return warned(name, "NCCL_NET_GDR_LEVEL=LOC disables GPUDirect RDMA")
    return passed(name, "no variable disables the IB transport")
