"""Which worker pods `trainwave logs` reads, in which order, under which prefix.

Pure: (job name, current attempt, gang size, observed pods, the user's choice)
-> log sources. When the attempt shown is a restart, the previous attempt's
worker that failed first comes first: its last lines usually say why the gang
restarted, and the operator keeps that attempt's finished pods for exactly
this (decide.py, `_clear_stale`). Workers that failed after it were most often
taken down by its failure, so only the first is shown.
"""

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from trainwave.lifecycle.observed import PodPhase, WorkerPod


class NoLogs(Exception):
    """The user asked for something the job does not have; the message says what it has."""


@dataclass(frozen=True)
class LogSource:
    pod: str
    rank: int
    attempt: int
    prefix: str
    # The previous attempt's first failed worker: finished, shown whole before the others.
    previous: bool = False
    exit_code: int | None = None
    reason: str = ""


def choose_sources(
    job: str,
    current_attempt: int,
    workers: int,
    pods: Sequence[WorkerPod],
    *,
    attempt: int | None = None,
    rank: int | None = None,
) -> list[LogSource]:
    shown = current_attempt if attempt is None else attempt
    kept = sorted({p.attempt for p in pods})
    if not 0 <= shown <= current_attempt:
        raise NoLogs(
            f"job {job} has no attempt {shown}: its attempts are 0..{current_attempt} "
            f"(pods kept for attempts {_listed(kept)})"
        )
    if rank is not None and not 0 <= rank < workers:
        raise NoLogs(
            f"job {job} has no rank {rank}: its {workers} workers are ranks 0..{workers - 1}"
        )
    ranked = sorted((p for p in pods if p.attempt == shown), key=lambda p: p.rank)
    if not ranked:
        raise NoLogs(
            f"job {job} has no pods of attempt {shown} (pods kept for attempts {_listed(kept)}; "
            "the operator keeps the current and the previous attempt's)"
        )
    if rank is not None:
        ranked = [p for p in ranked if p.rank == rank]
        if not ranked:
            raise NoLogs(f"job {job} has no pod of rank {rank} in attempt {shown} (yet)")
    sources = [LogSource(p.name, p.rank, p.attempt, f"[rank {p.rank}]") for p in ranked]
    culprit = first_failed(p for p in pods if p.attempt == shown - 1)
    if culprit is not None and (rank is None or culprit.rank == rank):
        prefix = f"[a{culprit.attempt} rank {culprit.rank}]"
        first = LogSource(
            culprit.name,
            culprit.rank,
            culprit.attempt,
            prefix,
            previous=True,
            exit_code=culprit.exit_code,
            reason=culprit.reason,
        )
        sources.insert(0, first)
    return sources


def first_failed(pods: Iterable[WorkerPod]) -> WorkerPod | None:
    """The worker that failed first: Failed phase or a non-zero exit, earliest finish.

    A pod without a finish time (deleted before its status said) sorts last.
    """
    failed = [
        p
        for p in pods
        if p.phase == PodPhase.FAILED or (p.exit_code is not None and p.exit_code != 0)
    ]
    if not failed:
        return None
    return min(failed, key=lambda p: (p.finished_at is None, _when(p.finished_at), p.rank))


def prefixed(source: LogSource, line: str) -> str:
    return f"{source.prefix} {line}"


def _when(finished: datetime | None) -> float:
    return 0.0 if finished is None else finished.timestamp()


def _listed(attempts: Sequence[int]) -> str:
    return ", ".join(map(str, attempts)) or "none"
