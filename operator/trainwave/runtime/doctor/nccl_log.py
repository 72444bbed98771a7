"""NCCL's own proof of which transport it uses, read from NCCL_DEBUG=INFO output.

Line shapes, as NCCL prints them (prefix `host:pid:tid [dev] NCCL INFO `):
  NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/RoCE [RO]; OOB eth0:10.0.0.1<0>
  NET/IB : No device found.
  NET/Socket : Using [0]eth0:10.0.0.1<0>
  Using network IB | Using network Socket
  NET/IB : GPU Direct RDMA Enabled for HCA 0 'mlx5_0'
  NET/IB : GPU Direct RDMA Disabled for HCA 0 'mlx5_0' (no module)
  GPU Direct RDMA Disabled for GPU 0[0] / HCA 0 (distance 5 > 4)
  Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0/GDRDMA     (GPUDirect in use)
  Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/4             (staged in host memory)
  Channel 03/0 : 15[7] -> 6[6] [send] via NET/Socket/3        (TCP)
  Channel 00/0 : 8[0] -> 15[7] via P2P/IPC/read               (inside the node)
  NCCL version 2.19.3+cuda12.3
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from trainwave.runtime.doctor.host import Host
from trainwave.runtime.doctor.report import Check, failed, passed, skipped, warned

_IB_USING = re.compile(r"NET/IB\s*:\s*Using\s+(.*?)(?:;\s*OOB\s+(\S+))?\s*$")
_IB_DEVICE = re.compile(r"\[\d+\]([\w.-]+:\d+)/(IB|RoCE)")
_SOCKET_USING = re.compile(r"NET/Socket\s*:\s*Using\s+(.*)$")
_NETWORK = re.compile(r"Using network (\S+)")
_CHANNEL = re.compile(r"Channel \d+(?:/\d+)?\s*:.*\bvia (NET/(\w+)/\d+(/GDRDMA)?)")
_GDR_OFF = re.compile(r"GPU Direct RDMA Disabled for (.*)$")
_VERSION = re.compile(r"NCCL version (\S+)")


@dataclass
class NcclEvidence:
    """What a set of NCCL log lines proves."""

    version: str | None = None
    network: str | None = None  # "IB", "Socket", or a plugin's name
    ib_devices: list[str] = field(default_factory=list)  # mlx5_0:1/RoCE
    socket_devices: str | None = None
    no_ib_device: bool = False
    gdr_channels: int = 0
    ib_channels_without_gdr: int = 0
    socket_channels: int = 0
    gdr_disabled: list[str] = field(default_factory=list)

    def feed(self, line: str) -> None:
        if (version := _VERSION.search(line)) is not None:
            self.version = version.group(1)
        if "NET/IB : No device found" in line:
            self.no_ib_device = True
        if (using := _IB_USING.search(line)) is not None:
            self.ib_devices = [f"{d}/{kind}" for d, kind in _IB_DEVICE.findall(using.group(1))]
        if (socket := _SOCKET_USING.search(line)) is not None:
            self.socket_devices = socket.group(1).strip()
        if (network := _NETWORK.search(line)) is not None:
            self.network = network.group(1)
        if (channel := _CHANNEL.search(line)) is not None:
            transport, gdr = channel.group(2), channel.group(3)
            if transport == "IB" and gdr:
                self.gdr_channels += 1
            elif transport == "IB":
                self.ib_channels_without_gdr += 1
            elif transport == "Socket":
                self.socket_channels += 1
        if (off := _GDR_OFF.search(line)) is not None:
            self.gdr_disabled.append(off.group(1).strip())

    @property
    def transport(self) -> str | None:
        if self.network is not None:
            return self.network
        if self.ib_devices:
            return "IB"
        if self.socket_devices is not None:
            return "Socket"
        return None

    def summary(self) -> dict[str, object]:
        return {
            "nccl_version": self.version,
            "network": self.transport,
            "ib_devices": self.ib_devices,
            "channels": {
                "gdrdma": self.gdr_channels,
                "ib_host_staged": self.ib_channels_without_gdr,
                "socket": self.socket_channels,
            },
            "gdr_disabled": self.gdr_disabled[:8],
        }


def parse_lines(lines: Iterable[str]) -> NcclEvidence:
    evidence = NcclEvidence()
    for line in lines:
        if "NCCL" in line or "NET/" in line or "Channel" in line:
            evidence.feed(line.rstrip("\n"))
    return evidence


def judge(evidence: NcclEvidence, *, expects_rdma: bool) -> Check:
    name = "nccl_transport"
    details = evidence.summary()
    transport = evidence.transport
    if transport is None and not evidence.no_ib_device:
        return skipped(name, "the NCCL log names no network (set NCCL_DEBUG=INFO)", **details)
    if transport == "Socket" or evidence.socket_channels:
        why = "NET/IB found no device" if evidence.no_ib_device else "NCCL chose TCP sockets"
        if expects_rdma:
            return failed(name, f"{why} although RDMA is expected: TCP in use", **details)
        return warned(name, f"{why}: inter-node traffic goes over TCP", **details)
    if transport != "IB":
        return warned(name, f"network plugin {transport!r}: GDR use not provable here", **details)
    if evidence.ib_channels_without_gdr:
        return warned(
            name,
            f"IB in use but {evidence.ib_channels_without_gdr} channel(s) without /GDRDMA: "
            "data is staged through host memory",
            **details,
        )
    if evidence.gdr_channels:
        return passed(
            name, f"IB with GPUDirect RDMA on {evidence.gdr_channels} channel(s)", **details
        )
    return warned(
        name, "IB selected, but no network channel in the log yet (single node?)", **details
    )


def check_nccl_logs(host: Host, logs: Iterable[Path] | None = None) -> Check:
    paths = list(host.nccl_logs if logs is None else logs)
    readable = [text for text in (host.read(path) for path in paths) if text is not None]
    if not readable:
        return skipped("nccl_transport", "no NCCL log yet (written once training communicates)")
    lines = (line for text in readable for line in text.splitlines())
    return judge(parse_lines(lines), expects_rdma=host.expects_rdma())
