"""The GPUDirect checklist: every check, in the order a person would fix them."""

from __future__ import annotations

from collections.abc import Callable

from trainwave.runtime.doctor.host import Host
from trainwave.runtime.doctor.nccl_log import check_nccl_logs
from trainwave.runtime.doctor.pci import check_gpu_nic_distance
from trainwave.runtime.doctor.rdma import (
    check_hca_ports,
    check_nccl_env,
    check_rdma_devices,
    check_roce_gid,
)
from trainwave.runtime.doctor.report import Check, DoctorReport, failed
from trainwave.runtime.doctor.system import check_iommu, check_memlock, check_peer_memory, check_shm

CHECKS: tuple[Callable[[Host], Check], ...] = (
    check_rdma_devices,
    check_hca_ports,
    check_roce_gid,
    check_nccl_env,
    check_peer_memory,
    check_memlock,
    check_shm,
    check_gpu_nic_distance,
    check_iommu,
    check_nccl_logs,
)


def run_doctor(host: Host) -> DoctorReport:
    """Run every check; a check that crashes is reported as FAIL, never hidden."""
    results = []
    for check in CHECKS:
        try:
            results.append(check(host))
        except Exception as error:  # one broken reader must not hide the other checks
            name = check.__name__.removeprefix("check_")
            results.append(failed(name, f"the check itself failed: {error!r}"))
    return DoctorReport.of(results)
