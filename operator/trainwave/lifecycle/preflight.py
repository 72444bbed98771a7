"""runPolicy.preflight: judge the gang's bandwidth test and re-place it without a slow node. Pure.

Each launcher runs the test once per attempt before the user's command
(runtime/preflight.py) and serves its ranks' figures in /status under
`preflight`: `bus_gbps` (a whole-gang all-reduce, nccl-tests' busbw) and, with two
workers or more, `sendrecv_gbps` (what each rank received from the same local rank
on the previous worker). The all-reduce runs at the pace of the ring's slowest link,
so every rank shows the same figure and it cannot say which node is slow; the
send/receive can. So the figure judged is `sendrecv_gbps` when every rank has it,
else `bus_gbps`.

Algorithm: once every worker of the current attempt has reported a finished test,
each worker's figure is the median of its ranks' (one slow process does not fail a
node; a slow link slows all its ranks). A worker fails when its figure is below
`minBusGbps`, or below `minFractionOfMedian` x the median of the OTHER workers'
figures (with two workers the median of all would sit between them). Failed workers'
nodes are marked like a straggler's (trainwave.io/straggler-until, placement/marks.py)
and the gang is recreated as a disruption (reason PreflightFailed); after
`maxFailures` failed tests in a row, or with maxDisruptions spent, the gang trains where
it is and the Preflight condition says why. A launcher whose test failed or timed out
gives no figure: the condition is Unknown (PreflightError), nothing is re-placed.
Each attempt is judged once (status.preflight.attempt).
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from statistics import median

from trainwave import contract
from trainwave.api.reasons import Reason
from trainwave.api.run_policy import Preflight
from trainwave.api.status import ConditionType, Phase, PreflightStatus
from trainwave.api.trainingjob import TrainingJob
from trainwave.lifecycle.draft import Draft, JobEvent
from trainwave.lifecycle.failures import Cause
from trainwave.lifecycle.observed import WorkerPod
from trainwave.lifecycle.reported import Repair
from trainwave.lifecycle.reports import PreflightReport, WorkerReport

NAMED = 4  # failed workers named in a message before "and N more"


@dataclass(frozen=True)
class SlowWorker:
    worker: int
    rank: int  # its slowest rank
    gbps: float  # the worker's figure (median of its ranks)
    floor: float  # the threshold it fell below
    why: str  # "minBusGbps 10" or "0.5 x the other workers' median 8.0 Gbit/s"


@dataclass(frozen=True)
class PreflightVerdict:
    passed: bool
    measure: str  # "sendrecv_gbps" or "bus_gbps"
    slow: tuple[SlowWorker, ...] = ()
    errors: tuple[str, ...] = ()  # "worker 1: ..." of launchers without figures
    slowest: tuple[int, float] | None = None  # (rank, Gbit/s)
    median_gbps: float | None = None


def judge(
    reports: Mapping[int, PreflightReport | None], workers: int, attempt: int, policy: Preflight
) -> PreflightVerdict | None:
    """None until every worker has reported a finished test of `attempt`."""
    found = {w: r for w, r in reports.items() if r is not None and r.attempt == attempt}
    if len(found) < workers or not all(r.done for r in found.values()):
        return None
    errors = tuple(
        f"worker {w}: {r.error or 'no figures'}"
        for w, r in sorted(found.items())
        if r.error or not r.ranks
    )
    ranks = {rank: (w, bw) for w, r in found.items() for rank, bw in r.ranks.items()}
    measure = (
        "sendrecv_gbps"
        if ranks and all(bw.sendrecv_gbps is not None for _, bw in ranks.values())
        else "bus_gbps"
    )
    figures = {
        rank: (w, value)
        for rank, (w, bw) in ranks.items()
        if (value := getattr(bw, measure)) is not None
    }
    if errors or not figures:
        return PreflightVerdict(False, measure, errors=errors or ("no rank reported figures",))
    per_worker: dict[int, list[tuple[float, int]]] = {}
    for rank, (w, value) in figures.items():
        per_worker.setdefault(w, []).append((value, rank))
    worker_figure = {w: median(v for v, _ in found) for w, found in per_worker.items()}
    slow = []
    for w in sorted(worker_figure):
        floor, why = _floor(w, worker_figure, policy)
        if floor is not None and worker_figure[w] < floor:
            slowest_rank = min(per_worker[w])[1]
            slow.append(SlowWorker(w, slowest_rank, worker_figure[w], floor, why))
    lowest = min(figures, key=lambda r: (figures[r][1], r))
    return PreflightVerdict(
        passed=not slow,
        measure=measure,
        slow=tuple(sorted(slow, key=lambda s: (s.gbps, s.worker))),
        slowest=(lowest, figures[lowest][1]),
        median_gbps=median(v for _, v in figures.values()),
    )


def _floor(
    worker: int, figures: Mapping[int, float], policy: Preflight
) -> tuple[float | None, str]:
    """The higher of the absolute and the relative floor for `worker`."""
    candidates: list[tuple[float, str]] = []
    if policy.min_bus_gbps is not None:
        candidates.append((policy.min_bus_gbps, f"minBusGbps {policy.min_bus_gbps:g}"))
    others = [value for w, value in figures.items() if w != worker]
    if others:
        typical = median(others)
        candidates.append(
            (
                policy.min_fraction_of_median * typical,
                f"{policy.min_fraction_of_median:g} x the other workers' median "
                f"{typical:.3g} Gbit/s",
            )
        )
    if not candidates:
        return None, ""
    return max(candidates)


def apply_preflight(
    draft: Draft,
    job: TrainingJob,
    current: Sequence[WorkerPod],
    reports: Mapping[int, WorkerReport],
) -> Repair | None:
    """Judge the current attempt's test once: status.preflight, the Preflight condition,
    an Event, and the repair that re-places the gang when a node failed."""
    policy = job.spec.run_policy.preflight
    status = draft.status
    if not policy.enabled or status.phase != Phase.RUNNING:
        return None
    before = status.preflight
    if before is not None and before.attempt == status.attempt:
        return None
    verdict = judge(
        {w: r.preflight for w, r in reports.items()}, job.spec.workers, status.attempt, policy
    )
    if verdict is None:
        return None
    in_a_row = before.failures if before is not None and not before.passed else 0
    figures = _figures(verdict)
    if verdict.errors:
        message = f"no verdict: {'; '.join(verdict.errors[:NAMED])}"
        draft.update(preflight=_status(status.attempt, verdict, in_a_row, message))
        draft.condition(ConditionType.PREFLIGHT, None, Reason.PREFLIGHT_ERROR, message)
        draft.events.append(JobEvent("Warning", Reason.PREFLIGHT_ERROR, message))
        return None
    if verdict.passed:
        message = f"every worker at or above the floor: {figures}"
        draft.update(preflight=_status(status.attempt, verdict, 0, message))
        draft.condition(ConditionType.PREFLIGHT, True, Reason.PREFLIGHT_PASSED, message)
        draft.events.append(JobEvent("Normal", Reason.PREFLIGHT_PASSED, message))
        return None
    failures = in_a_row + 1
    pods = {p.rank: p for p in current}
    named = "; ".join(_describe(s, pods.get(s.worker)) for s in verdict.slow[:NAMED])
    if len(verdict.slow) > NAMED:
        named += f"; and {len(verdict.slow) - NAMED} more"
    nodes = sorted({pods[s.worker].node for s in verdict.slow if s.worker in pods} - {None, ""})
    disruptions, limit = status.disruptions, job.spec.run_policy.failure_policy.max_disruptions
    stop = None
    if failures >= policy.max_failures:
        stop = f"{failures} tests failed in a row (maxFailures {policy.max_failures})"
    elif disruptions >= limit:
        stop = f"maxDisruptions ({limit}) is spent"
    elif not nodes:
        stop = "the slow workers' nodes are not known"
    if stop is not None:
        message = f"{named} ({figures}); {stop}: the gang trains where it is"
        draft.update(preflight=_status(status.attempt, verdict, failures, message))
        draft.condition(ConditionType.PREFLIGHT, False, Reason.PREFLIGHT_FAILURES_EXCEEDED, message)
        draft.events.append(JobEvent("Warning", Reason.PREFLIGHT_FAILURES_EXCEEDED, message))
        return None
    until = draft.now + timedelta(seconds=contract.STRAGGLER_MARK_SECONDS)
    stamp = until.isoformat().replace("+00:00", "Z")
    draft.mark_nodes.extend((node, until) for node in nodes)
    what = (
        f"preflight failed: {named} ({figures}); node {', '.join(nodes)} marked "
        f"{contract.ANNOTATION_STRAGGLER_UNTIL}={stamp} and the gang is placed without it"
    )
    draft.update(preflight=_status(status.attempt, verdict, failures, what))
    draft.condition(ConditionType.PREFLIGHT, False, Reason.PREFLIGHT_FAILED, what)
    # The restart's own Event (phase Restarting, reason PreflightFailed) carries `what`.
    return Repair(Cause.PREFLIGHT, what)


def _describe(slow: SlowWorker, pod: WorkerPod | None) -> str:
    where = f" (pod {pod.name}, node {pod.node or 'unknown'})" if pod is not None else ""
    return (
        f"worker {slow.worker}{where}, rank {slow.rank}: {slow.gbps:.3g} Gbit/s, below "
        f"{slow.floor:.3g} ({slow.why})"
    )


def _figures(verdict: PreflightVerdict) -> str:
    parts = [f"{verdict.measure}"]
    if verdict.slowest is not None:
        parts.append(f"slowest rank {verdict.slowest[0]} {verdict.slowest[1]:.3g} Gbit/s")
    if verdict.median_gbps is not None:
        parts.append(f"median {verdict.median_gbps:.3g} Gbit/s")
    return ", ".join(parts)


def _status(
    attempt: int, verdict: PreflightVerdict, failures: int, summary: str
) -> PreflightStatus:
    return PreflightStatus(
        attempt=attempt,
        passed=verdict.passed and not verdict.errors,
        failures=failures,
        slowest_gbps=verdict.slowest[1] if verdict.slowest else None,
        median_gbps=None if verdict.median_gbps is None else round(verdict.median_gbps, 3),
        summary=summary[:1000],
    )
