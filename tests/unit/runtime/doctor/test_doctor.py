"""The doctor's checklist on fake worker roots: a pass and a fail case per check."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from doctor_trees import (
    CAPEFF_IPC_LOCK,
    FAR_GPU_BUS,
    LIMITS_8MIB,
    OPEN_DRIVER,
    SWITCH,
    add_gpu,
    add_nic,
    healthy_root,
    host,
    write,
)

from trainwave.hardware.pci import Distance, pci_distance
from trainwave.runtime.doctor import CHECKS, Host, Status, run_doctor

Breaker = Callable[[Path], None]


def nothing(root: Path) -> None:
    pass


def remove(relative: str) -> Breaker:
    def apply(root: Path) -> None:
        target = root / relative
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        else:
            target.unlink()

    return apply


def replace(relative: str, text: str) -> Breaker:
    return lambda root: write(root / relative, text) and None


def both(*breakers: Breaker) -> Breaker:
    def apply(root: Path) -> None:
        for breaker in breakers:
            breaker(root)

    return apply


def far_gpu_only(root: Path) -> None:
    """The worker's GPU sits on the other socket: the path to mlx5_0 crosses sockets."""
    remove("proc/driver/nvidia/gpus")(root)
    add_gpu(root, FAR_GPU_BUS, "pci0000:80", "0000:80:01.0", numa=1)


def gpu_behind_host_bridge(root: Path) -> None:
    remove("proc/driver/nvidia/gpus")(root)
    add_gpu(root, "0000:28:00.0", "pci0000:00", "0000:00:03.0")


def nic_behind_two_switches(root: Path) -> None:
    remove("sys/class/infiniband/mlx5_0")(root)
    add_nic(root, "mlx5_0", *SWITCH, "0000:12:02.0", "0000:1a:00.0", "0000:1b:00.0")


def roce_without_v2(root: Path) -> None:
    remove("sys/class/infiniband/mlx5_0")(root)
    add_nic(root, "mlx5_0", *SWITCH, "0000:12:01.0", gid_types={"0": "IB/RoCE v1"})


def no_rdma_at_all(root: Path) -> None:
    remove("sys/class/infiniband")(root)
    remove("dev/infiniband")(root)


@dataclass(frozen=True)
class Case:
    check: str
    expected: Status
    breaker: Breaker = nothing
    env: dict[str, str] = field(default_factory=dict)
    reason_has: str = ""


CASES = {
    # rdma_devices
    "uverbs-present": Case("rdma_devices", Status.PASS),
    "uverbs-missing": Case(
        "rdma_devices", Status.FAIL, remove("dev/infiniband"), reason_has="uverbs"
    ),
    "no-rdma-expected": Case("rdma_devices", Status.SKIP, no_rdma_at_all, reason_has="TCP"),
    # hca_ports
    "port-active": Case("hca_ports", Status.PASS, reason_has="mlx5_0:1"),
    "port-down": Case(
        "hca_ports",
        Status.FAIL,
        replace("sys/class/infiniband/mlx5_0/ports/1/state", "1: DOWN\n"),
        reason_has="ACTIVE",
    ),
    "hca-env-matches": Case("hca_ports", Status.PASS, env={"NCCL_IB_HCA": "=mlx5_0:1"}),
    "hca-env-names-missing": Case(
        "hca_ports", Status.FAIL, env={"NCCL_IB_HCA": "=mlx5_0:1,mlx5_3:1"}, reason_has="mlx5_3:1"
    ),
    "hca-env-without-devices": Case(
        "hca_ports", Status.FAIL, no_rdma_at_all, env={"NCCL_IB_HCA": "mlx5_0"}, reason_has="empty"
    ),
    # roce_gid
    "roce-v2-present": Case("roce_gid", Status.PASS, reason_has="2.21"),
    "roce-v2-chosen": Case("roce_gid", Status.PASS, env={"NCCL_IB_GID_INDEX": "1"}),
    "roce-v1-chosen": Case(
        "roce_gid", Status.FAIL, env={"NCCL_IB_GID_INDEX": "0"}, reason_has="not RoCE v2"
    ),
    "roce-no-v2": Case("roce_gid", Status.FAIL, roce_without_v2, reason_has="no RoCE v2"),
    "infiniband-link": Case(
        "roce_gid",
        Status.SKIP,
        replace("sys/class/infiniband/mlx5_0/ports/1/link_layer", "InfiniBand\n"),
    ),
    # nccl_env
    "nccl-env-clean": Case("nccl_env", Status.PASS),
    "nccl-ib-disabled": Case(
        "nccl_env", Status.FAIL, env={"NCCL_IB_DISABLE": "1"}, reason_has="NCCL_IB_DISABLE"
    ),
    "nccl-net-socket": Case(
        "nccl_env", Status.FAIL, env={"NCCL_NET": "Socket"}, reason_has="NCCL_NET"
    ),
    # peer_memory
    "peermem-loaded": Case("peer_memory", Status.PASS, reason_has="nvidia_peermem"),
    "dmabuf-open-module": Case(
        "peer_memory",
        Status.PASS,
        both(
            remove("sys/module/nvidia_peermem"),
            replace("proc/driver/nvidia/version", OPEN_DRIVER),
            replace("proc/sys/kernel/osrelease", "6.8.0-45-generic\n"),
        ),
        reason_has="DMA-BUF",
    ),
    "dmabuf-old-kernel": Case(
        "peer_memory",
        Status.FAIL,
        both(
            remove("sys/module/nvidia_peermem"),
            replace("proc/driver/nvidia/version", OPEN_DRIVER),
            replace("proc/sys/kernel/osrelease", "5.4.0-100\n"),
        ),
        reason_has="kernel 5.4",
    ),
    "no-peer-memory": Case(
        "peer_memory", Status.FAIL, remove("sys/module/nvidia_peermem"), reason_has="proprietary"
    ),
    "peer-memory-no-gpu": Case("peer_memory", Status.SKIP, remove("proc/driver/nvidia/gpus")),
    # memlock
    "memlock-unlimited": Case("memlock", Status.PASS, reason_has="unlimited"),
    "memlock-ipc-lock": Case(
        "memlock",
        Status.PASS,
        both(
            replace("proc/self/limits", LIMITS_8MIB), replace("proc/self/status", CAPEFF_IPC_LOCK)
        ),
        reason_has="CAP_IPC_LOCK",
    ),
    "memlock-8mib": Case(
        "memlock", Status.FAIL, replace("proc/self/limits", LIMITS_8MIB), reason_has="8388608"
    ),
    # dev_shm
    "shm-8g": Case("dev_shm", Status.PASS, reason_has="8192 MiB"),
    "shm-docker-64m": Case(
        "dev_shm",
        Status.FAIL,
        replace("proc/self/mounts", "shm /dev/shm tmpfs rw,nosuid,size=65536k 0 0\n"),
        reason_has="64 MiB",
    ),
    "shm-512m": Case(
        "dev_shm", Status.WARN, replace("proc/self/mounts", "shm /dev/shm tmpfs rw,size=512m 0 0\n")
    ),
    # gpu_nic_distance
    "gpu-nic-same-switch": Case("gpu_nic_distance", Status.PASS, reason_has="PXB"),
    "gpu-nic-across-sockets": Case(
        "gpu_nic_distance", Status.WARN, far_gpu_only, reason_has=FAR_GPU_BUS
    ),
    "gpu-nic-phb": Case("gpu_nic_distance", Status.WARN, gpu_behind_host_bridge),
    "gpu-nic-phb-allowed": Case(
        "gpu_nic_distance", Status.PASS, gpu_behind_host_bridge, env={"NCCL_NET_GDR_LEVEL": "PHB"}
    ),
    "gpu-nic-two-switches": Case("gpu_nic_distance", Status.PASS, nic_behind_two_switches),
    "gpu-nic-no-gpu": Case("gpu_nic_distance", Status.SKIP, remove("proc/driver/nvidia/gpus")),
    # iommu
    "iommu-off": Case("iommu", Status.PASS, reason_has="no IOMMU"),
    "iommu-translating": Case(
        "iommu",
        Status.WARN,
        lambda root: (root / "sys/class/iommu/dmar0").mkdir() and None,
        reason_has="iommu=pt",
    ),
    "iommu-passthrough": Case(
        "iommu",
        Status.PASS,
        both(
            lambda root: (root / "sys/class/iommu/dmar0").mkdir() and None,
            replace("proc/cmdline", "root=/dev/sda1 intel_iommu=on iommu=pt\n"),
        ),
        reason_has="passthrough",
    ),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_check(tmp_path: Path, case: Case) -> None:
    root = healthy_root(tmp_path)
    case.breaker(root)
    check = run_doctor(host(root, **case.env)).check(case.check)
    assert check.status is case.expected, check
    assert case.reason_has in check.reason


def test_healthy_worker_passes_every_check(tmp_path: Path) -> None:
    report = run_doctor(host(healthy_root(tmp_path)))
    assert report.verdict is Status.PASS, report.render()
    assert {check.status for check in report.checks} == {Status.PASS, Status.SKIP}
    assert report.check("nccl_transport").status is Status.SKIP  # no log yet
    assert len(report.checks) == len(CHECKS)


def test_verdict_is_the_worst_status(tmp_path: Path) -> None:
    root = healthy_root(tmp_path)
    remove("dev/infiniband")(root)
    replace("proc/self/mounts", "shm /dev/shm tmpfs rw,size=512m 0 0\n")(root)
    report = run_doctor(host(root))
    assert report.verdict is Status.FAIL
    assert report.as_dict()["verdict"] == "FAIL"
    assert "verdict: FAIL" in report.render()


def test_a_crashing_check_is_reported_not_hidden(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def explode(host: Host) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr("trainwave.runtime.doctor.checklist.CHECKS", (explode,))
    report = run_doctor(host(tmp_path))
    assert report.verdict is Status.FAIL
    assert "boom" in report.checks[0].reason


PCI = {
    # gpu path, gpu numa, nic path, nic numa -> expected
    "same-switch": (
        ("pci0000:00", "rp", "up", "dn0", "gpu"),
        0,
        ("pci0000:00", "rp", "up", "dn1", "nic"),
        0,
        Distance.PIX,
    ),
    "nested-switches": (
        ("pci0000:00", "rp", "up", "dn0", "gpu"),
        0,
        ("pci0000:00", "rp", "up", "dn1", "up2", "dn2", "nic"),
        0,
        Distance.PXB,
    ),
    "host-bridge": (("pci0000:00", "rp0", "gpu"), 0, ("pci0000:00", "rp1", "nic"), 0, Distance.PHB),
    "same-numa-other-root": (
        ("pci0000:00", "rp", "gpu"),
        0,
        ("pci0000:40", "rp", "nic"),
        0,
        Distance.NODE,
    ),
    "other-socket": (("pci0000:00", "rp", "gpu"), 0, ("pci0000:80", "rp", "nic"), 1, Distance.SYS),
    "unknown-numa": (
        ("pci0000:00", "rp", "gpu"),
        None,
        ("pci0000:80", "rp", "nic"),
        None,
        Distance.SYS,
    ),
}


@pytest.mark.parametrize(
    ("gpu", "gpu_numa", "nic", "nic_numa", "expected"), PCI.values(), ids=PCI.keys()
)
def test_pci_distance(
    gpu: tuple[str, ...],
    gpu_numa: int | None,
    nic: tuple[str, ...],
    nic_numa: int | None,
    expected: Distance,
) -> None:
    # The agent's rule (trainwave.hardware.pci), which the doctor applies in the pod.
    assert pci_distance("/".join(gpu), gpu_numa, "/".join(nic), nic_numa) is expected


CLI = {
    "healthy": (nothing, 0, "verdict: PASS"),
    "warning": (
        replace("proc/self/mounts", "shm /dev/shm tmpfs rw,size=512m 0 0\n"),
        1,
        "WARN  dev_shm",
    ),
    "failure": (remove("dev/infiniband"), 2, "FAIL  rdma_devices"),
}


@pytest.mark.parametrize("case", CLI.values(), ids=CLI.keys())
def test_cli_exit_code_follows_the_verdict(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    case: tuple[Breaker, int, str],
) -> None:
    breaker, code, output_has = case
    from trainwave.cli import main

    for name in (
        "NCCL_IB_HCA",
        "NCCL_IB_DISABLE",
        "NCCL_NET",
        "NCCL_NET_GDR_LEVEL",
        "NCCL_IB_GID_INDEX",
    ):
        monkeypatch.delenv(name, raising=False)
    root = healthy_root(tmp_path)
    breaker(root)
    assert main(["doctor", "--root", str(root)]) == code
    assert output_has in capsys.readouterr().out


def test_cli_json_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from trainwave.cli import main

    main(["doctor", "--root", str(tmp_path), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert {check["name"] for check in report["checks"]} >= {"rdma_devices", "memlock", "dev_shm"}
