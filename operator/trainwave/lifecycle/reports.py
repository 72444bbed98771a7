"""What the workers' runtime reports, and what the job's status makes of it. Pure.

Each worker's launcher serves a JSON document (runtime/launch.py `status`):
its doctor report and, from the lowest rank on the node, training progress.
The controller fetches them; this module reads them once into frozen
`WorkerReport`s and turns them into `status.progress` (from rank 0) and the
`RDMAVerified` condition (from every worker): RDMA counts as verified only
when NCCL's own log proves GPUDirect RDMA on IB in every worker, so a
cluster that silently fell back to TCP shows False, with the worker and why.

The goodput keys (`ranks`, `restarts`, `in_place`, `preflight`: the contract of
issue 26, read by lifecycle/goodput.py and lifecycle/preflight.py) are written by
the tenant's processes, so each value is taken only when it has the expected type
and range; anything else is dropped as if absent, never raised. An older runtime sends none of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from math import isfinite
from typing import Any

from trainwave.api.reasons import Reason
from trainwave.api.status import ProgressStatus

NCCL_CHECK = "nccl_transport"
# Bounds on what a report may make the operator hold: ranks per worker, and causes.
MAX_RANKS_PER_REPORT = 1024
RANK_STATES = frozenset({"running", "stopped", "exited", "unknown"})
RESTART_CAUSES = ("failure", "hang", "peer")
MAX_HISTORY = 20  # compute_history values taken per rank (runtime/telemetry.py)


@dataclass(frozen=True)
class RankReport:
    """One global rank's latest progress report, as its worker's launcher relays it."""

    step: int | None  # last completed step
    time: float | None  # the worker's wall clock when it was written (not ours)
    step_seconds: float | None  # median wall time per step over the last window
    compute_seconds: float | None  # median compute time per step: the straggler signal
    generation: int | None  # TORCHELASTIC_RESTART_COUNT of the writing process
    state: str = "unknown"  # running | stopped | exited | unknown
    # compute_seconds of the rank's last reports, oldest first (at most MAX_HISTORY): the
    # runtime reports more often than the operator polls, so stragglers are judged on these.
    compute_history: tuple[float, ...] = ()


@dataclass(frozen=True)
class InPlaceRestart:
    """The last in-place restart a launcher saw; times are that worker's own clock."""

    cause: str
    at: float | None
    step_before: int | None
    resumed_from: int | None
    first_step_at: float | None


@dataclass(frozen=True)
class RestartReport:
    """In-place restarts seen by one launcher in its pod (this attempt only)."""

    count: int
    causes: Mapping[str, int] = field(default_factory=dict)
    last: InPlaceRestart | None = None


@dataclass(frozen=True)
class InPlaceSetting:
    enabled: bool
    max_restarts: int | None = None
    hang_timeout_seconds: float | None = None
    reason: str = ""


@dataclass(frozen=True)
class RankBandwidth:
    """One rank's figures from runPolicy.preflight's test, Gbit/s."""

    bus_gbps: float | None
    sendrecv_gbps: float | None


@dataclass(frozen=True)
class PreflightReport:
    """One launcher's test, as read from its /status document (tenant-written: every
    value is checked, anything malformed is dropped)."""

    attempt: int | None
    done: bool
    ranks: Mapping[int, RankBandwidth] = field(default_factory=dict)
    error: str | None = None


def read_preflight(found: Any) -> PreflightReport | None:
    if not isinstance(found, dict) or not isinstance(found.get("done"), bool):
        return None
    attempt = found.get("attempt")
    error = found.get("error")
    ranks: dict[int, RankBandwidth] = {}
    raw = found.get("ranks")
    for key, value in list(raw.items() if isinstance(raw, dict) else [])[:MAX_RANKS_PER_REPORT]:
        rank = _rank(key)
        if rank is not None and isinstance(value, dict):
            # Gbit/s: a finite non-negative number, like seconds.
            ranks[rank] = RankBandwidth(
                _seconds(value.get("bus_gbps")), _seconds(value.get("sendrecv_gbps"))
            )
    return PreflightReport(
        attempt=attempt if isinstance(attempt, int) and not isinstance(attempt, bool) else None,
        done=found["done"],
        ranks=ranks,
        error=error[:300] if isinstance(error, str) and error else None,
    )


@dataclass(frozen=True)
class WorkerReport:
    node_rank: int
    verdict: str | None  # the doctor's PASS / WARN / FAIL; None before it ran
    failed_checks: tuple[str, ...]  # "name: reason" of each FAIL
    nccl: tuple[str, str] | None  # (status, reason) of NCCL's transport check
    progress: Mapping[str, Any] | None
    ranks: Mapping[int, RankReport] = field(default_factory=dict)  # global rank -> report
    restarts: RestartReport | None = None
    in_place: InPlaceSetting | None = None
    preflight: PreflightReport | None = None  # runPolicy.preflight's test (lifecycle/preflight.py)


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
        ranks=read_ranks(document.get("ranks")),
        restarts=read_restarts(document.get("restarts")),
        in_place=read_in_place(document.get("in_place")),
        preflight=read_preflight(document.get("preflight")),
    )


def read_ranks(found: Any) -> dict[int, RankReport]:
    """`ranks` of a /status document: {"3": {...}}; keys that are not ranks are skipped."""
    if not isinstance(found, dict):
        return {}
    ranks: dict[int, RankReport] = {}
    for key, value in list(found.items())[:MAX_RANKS_PER_REPORT]:
        rank = _rank(key)
        if rank is None or not isinstance(value, dict):
            continue
        state = value.get("state")
        ranks[rank] = RankReport(
            step=_count(value.get("step")),
            time=_seconds(value.get("time")),
            step_seconds=_seconds(value.get("step_seconds")),
            compute_seconds=_seconds(value.get("compute_seconds")),
            generation=_count(value.get("generation")),
            state=state if isinstance(state, str) and state in RANK_STATES else "unknown",
            compute_history=_history(value.get("compute_history")),
        )
    return ranks


def _history(found: Any) -> tuple[float, ...]:
    """compute_history: a list of up to MAX_HISTORY positive finite numbers. A longer list
    is not a report of ours, and neither is one with any other value: both read as none."""
    if not isinstance(found, list) or len(found) > MAX_HISTORY:
        return ()
    values = [_seconds(item) for item in found]
    if any(value is None or value <= 0 for value in values):
        return ()
    return tuple(value for value in values if value is not None)


def read_restarts(found: Any) -> RestartReport | None:
    if not isinstance(found, dict) or (count := _count(found.get("count"))) is None:
        return None
    causes = found.get("causes")
    known = {
        cause: n
        for cause in RESTART_CAUSES
        if isinstance(causes, dict) and (n := _count(causes.get(cause))) is not None
    }
    last = found.get("last")
    return RestartReport(
        count=count,
        causes=known,
        last=_last_restart(last) if isinstance(last, dict) else None,
    )


def read_in_place(found: Any) -> InPlaceSetting | None:
    if not isinstance(found, dict) or not isinstance(found.get("enabled"), bool):
        return None
    reason = found.get("reason")
    return InPlaceSetting(
        enabled=found["enabled"],
        max_restarts=_count(found.get("max_restarts")),
        hang_timeout_seconds=_seconds(found.get("hang_timeout_seconds")),
        reason=reason[:200] if isinstance(reason, str) else "",
    )


def _last_restart(found: Mapping[str, Any]) -> InPlaceRestart:
    cause = found.get("cause")
    return InPlaceRestart(
        cause=cause if isinstance(cause, str) and cause in RESTART_CAUSES else "unknown",
        at=_seconds(found.get("at")),
        step_before=_count(found.get("step_before")),
        resumed_from=_count(found.get("resumed_from")),
        first_step_at=_seconds(found.get("first_step_at")),
    )


def _rank(key: Any) -> int | None:
    if not isinstance(key, str) or not (key.isascii() and key.isdigit()) or len(key) > 7:
        return None
    return int(key)


def _count(value: Any) -> int | None:
    """A non-negative int; bools and floats are not counts."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def _seconds(value: Any) -> float | None:
    """A finite non-negative number of seconds (or an epoch time)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if isfinite(value) and value >= 0 else None


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
