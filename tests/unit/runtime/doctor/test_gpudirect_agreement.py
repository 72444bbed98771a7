"""The node agent labels GPUDirect RDMA and the doctor checks it in the pod: one answer.

Both call trainwave.hardware.gpudirect; this table keeps them from drifting
apart again (the doctor once missed a module listed only in /proc/modules).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from doctor_trees import OPEN_DRIVER, healthy_root, host, write

from trainwave.agent import sysfs
from trainwave.agent.discovery import gdr_readiness
from trainwave.runtime.doctor import Status
from trainwave.runtime.doctor.system import check_peer_memory

pytestmark = pytest.mark.timeout(10)


def no_module(root: Path) -> None:
    shutil.rmtree(root / "sys/module/nvidia_peermem")


def listed_in_proc_modules(root: Path) -> None:
    no_module(root)
    write(root / "proc/modules", "nvidia_peermem 16384 0 - Live 0x0000000000000000\n")


def nv_mem_client(root: Path) -> None:
    no_module(root)
    (root / "sys/kernel/mm/memory_peers/nv_mem").mkdir(parents=True)


def open_driver_on(kernel: str) -> Callable[[Path], None]:
    def change(root: Path) -> None:
        no_module(root)
        write(root / "proc/driver/nvidia/version", OPEN_DRIVER)
        write(root / "proc/sys/kernel/osrelease", f"{kernel}\n")

    return change


CASES = {
    "module-loaded": (lambda root: None, True),
    "module-in-proc-modules": (listed_in_proc_modules, True),
    "nv-mem-peer-client": (nv_mem_client, True),
    "dmabuf-open-driver-new-kernel": (open_driver_on("6.1.0-18-amd64"), True),
    "dmabuf-open-driver-old-kernel": (open_driver_on("5.4.0-150-generic"), False),
    "proprietary-driver-no-module": (no_module, False),
}


@pytest.mark.parametrize(("change", "works"), CASES.values(), ids=CASES.keys())
def test_agent_label_and_doctor_check_agree(
    tmp_path: Path, change: Callable[[Path], None], works: bool
) -> None:
    root = healthy_root(tmp_path)
    change(root)
    nics, _ = sysfs.read_nics(root)
    agent = gdr_readiness(root, nics)
    doctor = check_peer_memory(host(root, NCCL_IB_HCA="=mlx5_0:1"))
    assert agent.possible is works, agent.reason
    assert (doctor.status is Status.PASS) is works, doctor.reason
