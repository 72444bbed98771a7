"""What the workers' runtime reports, and what the job's status makes of it. Pure.

Each worker's launcher serves a JSON document (runtime/launch.py `status`):
its doctor report and, from the lowest rank on the node, training progress.
The controller fetches them; this module reads them once into frozen
`WorkerReport`s and turns them into `status.progress` (from rank 0) and the
`RDMAVerified` condition (from every worker): RDMA counts as verified only
when NCCL's own log proves GPUDirect RDMA on IB in every worker, so a
cluster that silently fell back to TCP shows False, with the worker and why.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from trainwave.api.reasons import Reason
from trainwave.api.status import ProgressStatus

NCCL_CHECK = "nccl_transport"


@dataclass(frozen=True)
class WorkerReport:
    node_rank: int
    verdict: str | None  # the doctor's PASS / WARN / FAIL; None before it ran
    failed_checks: tuple[str, ...]  # "name: reason" of each FAIL
    nccl: tuple[str, str] | None  # (status, reason) of NCCL's transport check
    progress: Mapping[str, Any] | None


def read_report(document: Mapping[str, Any]) -> WorkerReport | None:
    """A WorkerReport from a /status document; None when it is not one."""
    node_rank = document.get("node_rank")
    if not isinstance(node_rank, int):
        return None
    doctor = document.get("doctor") if isinstance(document.get("doctor"), dict) else None
    checks = [c for c in (doctor or {}).get("checks", []) if isinstance(c, dict)]
    failed = tuple(
        f"{c.get('name')}: {c.get('reason')}" for c in checks if c.get("status") == "FAIL"
    )
    nccl = next(
        (
            (str(c.get("status")), str(c.get("reason", "")))
            for c in checks
            if c.get("name") == NCCL_CHECK
        ),
        None,
    )
    progress = document.get("progress")
    return WorkerReport(
        node_rank=node_rank,
        verdict=str(doctor["verdict"]) if doctor and "verdict" in doctor else None,
        failed_checks=failed,
        nccl=nccl,
        progress=progress if isinstance(progress, dict) else None,
    )


def progress_status(reports: Mapping[int, WorkerReport]) -> ProgressStatus | None:
    report = reports.get(0)
    if report is None or report.progress is None:
        return None
    found = report.progress
    step = _number(found.get("step"), int)
    total = _number(found.get("total_steps"), int)
    eta = _number(found.get("eta_seconds"), float)
    rate = _number(found.get("samples_per_second"), float)
    parts = [f"step {step}" + (f"/{total}" if total else "")] if step is not None else []
    if rate is not None:
        parts.append(f"{rate:.3g} samples/s")
    if eta is not None:
        parts.append(f"ETA {_duration(eta)}")
    return ProgressStatus(
        step=step,
        total_steps=total,
        samples_per_second=rate,
        loss=_number(found.get("loss"), float),
        eta_seconds=eta,
        summary=", ".join(parts),
    )


def rdma_verdict(reports: Mapping[int, WorkerReport], workers: int) -> tuple[str, str, str]:
    """(status, reason, message) of the RDMAVerified condition."""
    for rank in sorted(reports):
        report = reports[rank]
        # NCCL's own word first: it is the proof, the rest are reasons.
        if report.nccl is not None and report.nccl[0] in ("FAIL", "WARN"):
            return "False", Reason.NOT_GPUDIRECT, f"worker {rank}: {report.nccl[1]}"
        if report.failed_checks:
            return (
                "False",
                Reason.DOCTOR_FAILED,
                f"worker {rank}: {'; '.join(report.failed_checks)}",
            )
    proven = [r for r in reports.values() if r.nccl is not None and r.nccl[0] == "PASS"]
    if len(proven) == workers:
        return "True", Reason.GPUDIRECT_IN_USE, f"NCCL uses GPUDirect RDMA in all {workers} workers"
    return (
        "Unknown",
        Reason.WAITING_FOR_PROOF,
        f"{len(proven)}/{workers} workers have shown GPUDirect RDMA in NCCL's log so far",
    )


def _number(value: Any, kind: type[int] | type[float]) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return kind(value)


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"
