"""NCCL's NCCL_DEBUG=INFO output judged by the doctor, on lines in NCCL's real formats.

The line shapes come from NCCL logs posted in NVIDIA/nccl and nccl-tests
issues (#707, #952, #1412, nccl-tests #185); host names and addresses are
replaced.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from trainwave.runtime.doctor import Host, Status
from trainwave.runtime.doctor.nccl_log import check_nccl_logs, judge, parse_lines

P = "node-a:24570:24907 [0] NCCL INFO "

GDR_ROCE = [
    "NCCL version 2.19.3+cuda12.3",
    P + "NET/IB : Using [0]mlx5_10:1/RoCE [1]mlx5_11:1/RoCE [RO]; OOB enp220s0np0:10.1.0.4<0>",
    P + "Using network IB",
    P + "Channel 01/0 : 2[c7000] -> 0[87000] [receive] via NET/IB/5/GDRDMA",
    P + "Channel 01/0 : 0[87000] -> 2[c7000] [send] via NET/IB/5/GDRDMA",
    P + "Channel 00/0 : 8[0] -> 15[7] via P2P/IPC/read",
]
IB_HOST_STAGED = [
    P + "NET/IB : Using [0]mlx5_0:1/IB ; OOB ib0:192.168.11.1<0>",
    P + "Using network IB",
    P + "Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/4",
    P + "Channel 01/0 : 0[0] -> 1[0] [send] via NET/IB/5",
    P + "NCCL_IB_GID_INDEX set by environment to 3.",
    P + "Connected all rings, use ring PXN 0 GDR 0",
]
SOCKET_FALLBACK = [
    P + "NET/IB : No device found.",
    P + "NET/Socket : Using [0]eth0:10.0.0.7<0>",
    P + "Using network Socket",
    P + "Channel 03/0 : 15[7] -> 6[6] [send] via NET/Socket/3",
]
SINGLE_NODE = [
    P + "NET/IB : Using [0]mlx5_0:1/IB ; OOB ib0:192.168.11.1<0>",
    P + "Using network IB",
    P + "Channel 04/0 : 0[0] -> 7[7] via P2P/CUMEM",
]
NO_NETWORK_LINES = [P + "cudaDriverVersion 12080", P + "Bootstrap : Using bond0:172.16.0.4<0>"]

CASES = {
    "roce-gdrdma": (GDR_ROCE, True, Status.PASS, "GPUDirect RDMA on 2"),
    "ib-without-gdr": (IB_HOST_STAGED, True, Status.WARN, "without /GDRDMA"),
    "socket-fallback-rdma-expected": (SOCKET_FALLBACK, True, Status.FAIL, "no device"),
    "socket-no-rdma-expected": (SOCKET_FALLBACK, False, Status.WARN, "TCP"),
    "single-node-no-net-channel": (SINGLE_NODE, True, Status.WARN, "no network channel"),
    "no-debug-output": (NO_NETWORK_LINES, True, Status.SKIP, "NCCL_DEBUG=INFO"),
}


@pytest.mark.parametrize(
    ("lines", "expects_rdma", "expected", "reason_has"), CASES.values(), ids=CASES.keys()
)
def test_judge(lines: list[str], expects_rdma: bool, expected: Status, reason_has: str) -> None:
    check = judge(parse_lines(lines), expects_rdma=expects_rdma)
    assert check.status is expected, check
    assert reason_has in check.reason


def test_evidence_names_devices_version_and_channels() -> None:
    evidence = parse_lines(GDR_ROCE)
    assert evidence.version == "2.19.3+cuda12.3"
    assert evidence.ib_devices == ["mlx5_10:1/RoCE", "mlx5_11:1/RoCE"]
    assert (evidence.gdr_channels, evidence.ib_channels_without_gdr, evidence.socket_channels) == (
        2,
        0,
        0,
    )


def test_gdr_disabled_lines_are_collected() -> None:
    lines = [*IB_HOST_STAGED, P + "GPU Direct RDMA Disabled for GPU 0[0] / HCA 0 (distance 5 > 4)"]
    evidence = parse_lines(lines)
    assert evidence.gdr_disabled == ["GPU 0[0] / HCA 0 (distance 5 > 4)"]


def test_check_reads_every_log_file(tmp_path: Path) -> None:
    first = tmp_path / "nccl.node-a.11.log"
    second = tmp_path / "nccl.node-a.12.log"
    first.write_text("\n".join(GDR_ROCE[:3]) + "\n")
    second.write_text("\n".join(GDR_ROCE[3:]) + "\n")
    host = Host(root=tmp_path, environ={"NCCL_IB_HCA": "mlx5"}, nccl_logs=(first, second))
    assert check_nccl_logs(host).status is Status.PASS


def test_check_without_logs_is_skipped(tmp_path: Path) -> None:
    host = Host(root=tmp_path, nccl_logs=(tmp_path / "missing.log",))
    assert check_nccl_logs(host).status is Status.SKIP
