"""Goodput from the workers' reports: a hung gang, a straggling rank, what faults cost. Pure.

The launchers relay each rank's latest progress report (lifecycle/reports.py
`RankReport`). The operator keeps a small `Memory` per job between polls (the
controller holds it; every function here takes it and returns the next one),
so deciding twice on the same reports changes nothing:
- `observe` stamps each rank's report with the time the operator first saw it;
- `judge_hang`: no rank's step moved for runPolicy.hangTimeoutSeconds while the
  whole gang runs -> Hung, naming the stalled ranks, the one furthest behind and
  any stopped one; still hung one more full timeout after the condition was set
  (the launchers could not restart the processes in place) -> recreate the gang;
- `stragglers`: a rank whose compute time per step is at least `slowdown` times the
  median of the OTHER ranks (with 2 ranks the gang's median would sit between the
  two and hide a 2x rank) in each of its last `reports` reports is named. The
  runtime reports every telemetry interval (seconds) and the operator polls every
  status interval (15 s by default), so each rank's report carries the
  compute_seconds of its last reports (`compute_history`) and the decision is
  taken on those: a rank is named at the first poll after `reports` slow reports.
  A runtime without the history falls back to counting consecutive fresh polls;
- `account`: status.goodput, cumulative over attempts and idempotent (see
  GoodputAttempt in api/status.py).

Clocks: staleness is measured on the operator's clock only. A report's `time` is
the worker's wall clock, which may be skewed against ours and against other
workers'; it serves only to tell a new report from the one seen before, and
differences of two times from the same worker (fault -> first new step) are
taken as they are. The price: a stall is seen up to one poll interval late, and
after an operator restart the clock of every rank starts at its first sight.
"""

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from statistics import median

from trainwave.api.run_policy import Stragglers
from trainwave.api.status import GoodputAttempt, GoodputStatus
from trainwave.lifecycle.reports import InPlaceRestart, RankReport, RestartReport, WorkerReport

NAMED_RANKS = 8  # ranks named in a message before "and N more"


@dataclass(frozen=True)
class RankSeen:
    """One rank's latest report as the operator saw it."""

    worker: int  # the worker (node rank) that relayed it
    report: RankReport
    seen_at: datetime  # the operator's clock when its step last moved (or first sight)
    fresh: bool = False  # a report not seen by the previous observation
    slow: int = 0  # consecutive fresh reports at or above the slowdown
    slowdown: float | None = None  # of the latest report, against the others' median
    # In-place restarts its launcher has counted: a new one is movement too, since the
    # new processes take a while (imports, rendezvous, the checkpoint) to report a step.
    worker_restarts: int = 0
    restarted: bool = False  # the latest movement was a restart, not a step


@dataclass(frozen=True)
class Memory:
    attempt: int
    ranks: Mapping[int, RankSeen] = field(default_factory=dict)


def observe(
    memory: Memory | None,
    attempt: int,
    reports: Mapping[int, WorkerReport],
    now: datetime,
    policy: Stragglers,
    *,
    stalled_since: datetime | None = None,
    rejoining: bool = False,
) -> Memory:
    """The next memory from the reports of `attempt`. `stalled_since`: when the job is
    already Hung, the time its last step is known to be older than: a rank first seen
    then (after an operator restart) keeps the job hung instead of clearing it.
    `rejoining`: the gang runs again after a worker was replaced alone, so every rank
    first seen now belongs to processes that start again (the kept workers' agents
    restart theirs into the new rendezvous; for worker 0, after their launchers start
    the agents again and cluster DNS gives them the new pod's address, cached up to its
    TTL) and is judged from its first step, as an in-place restart is."""
    previous = memory.ranks if memory is not None and memory.attempt == attempt else {}
    found = {
        rank: (report.node_rank, rank_report)
        for report in reports.values()
        for rank, rank_report in report.ranks.items()
    }
    restarts = {
        report.node_rank: report.restarts.count if report.restarts else 0
        for report in reports.values()
    }
    signals = _signals({rank: rank_report for rank, (_, rank_report) in found.items()})
    ranks: dict[int, RankSeen] = {}
    for rank, (worker, report) in sorted(found.items()):
        before = previous.get(rank)
        slowdown = _slowdown(rank, signals)
        worker_restarts = restarts.get(worker, 0)
        restarted = False
        if before is None:
            seen_at = stalled_since if stalled_since is not None else now
            fresh, slow = True, 0
            restarted = rejoining and stalled_since is None
        else:
            stepped = (report.step, report.generation) != (
                before.report.step,
                before.report.generation,
            )
            restarted = not stepped and worker_restarts > before.worker_restarts
            seen_at = now if stepped or restarted else before.seen_at
            restarted = restarted or (before.restarted and not stepped)
            fresh, slow = report != before.report, before.slow
        if fresh and slowdown is not None:
            slow = slow + 1 if slowdown >= policy.slowdown else 0
        ranks[rank] = RankSeen(
            worker, report, seen_at, fresh, slow, slowdown, worker_restarts, restarted
        )
    return Memory(attempt, ranks)


@dataclass(frozen=True)
class HangVerdict:
    hung: bool
    message: str
    recreate: bool = False  # still hung a full timeout after the condition was set
    recheck_after: float | None = None  # seconds until this verdict may change by time alone


def judge_hang(
    memory: Memory, timeout: int | None, now: datetime, hung_since: datetime | None
) -> HangVerdict | None:
    """None when there is nothing to judge: no hangTimeoutSeconds, or no rank has reported
    a step yet (start-up, data loading and compilation before the first step are not
    hangs). The caller judges only a gang whose workers all run. `hung_since`: when the
    Hung condition became True, if it is."""
    ranks = {r: seen for r, seen in memory.ranks.items() if seen.report.step is not None}
    if timeout is None or not ranks:
        return None
    restarting = sorted(r for r, seen in ranks.items() if seen.restarted)
    if restarting:
        # A generation restarted in place starts as the first one did (new processes
        # importing torch, the rendezvous, the checkpoint) and is judged, like it, from its
        # first step: the launchers' watchdog arms only then too. On 2 loaded cores a
        # restart took 40 s against a 20 s timeout, which read Hung before (issue 26).
        # torch's rendezvous join_timeout (600 s by default) bounds a gang that cannot form again.
        listed = ", ".join(map(str, restarting[:NAMED_RANKS]))
        return HangVerdict(
            False,
            f"rank {listed}'s processes restarted in place; the new generation is judged "
            "from its first step",
            recheck_after=float(timeout),
        )
    last_move = max(seen.seen_at for seen in ranks.values())
    quiet = (now - last_move).total_seconds()
    if quiet < timeout:
        moved = max(ranks, key=lambda r: (ranks[r].seen_at, -r))
        news = f"rank {moved} completed step {ranks[moved].report.step}"
        return HangVerdict(False, news, recheck_after=timeout - quiet)
    message = _stalled(ranks, quiet, timeout)
    if hung_since is None:
        return HangVerdict(True, message, recheck_after=float(timeout))
    persisting = (now - hung_since).total_seconds()
    if persisting >= timeout:
        return HangVerdict(True, message, recreate=True)
    return HangVerdict(True, message, recheck_after=timeout - persisting)


def _stalled(ranks: Mapping[int, RankSeen], quiet: float, timeout: int) -> str:
    steps = {r: seen.report.step or 0 for r, seen in ranks.items()}
    listed = ", ".join(f"{r} (step {steps[r]})" for r in sorted(ranks)[:NAMED_RANKS])
    more = len(ranks) - NAMED_RANKS
    parts = [
        f"no rank completed a step for {quiet:.0f}s (hangTimeoutSeconds {timeout}); "
        f"stalled ranks: {listed}" + (f" and {more} more" if more > 0 else "")
    ]
    behind = min(steps, key=lambda r: (steps[r], r))
    if steps[behind] < max(steps.values()):
        parts.append(f"rank {behind} is behind at step {steps[behind]}")
    stopped = sorted(r for r, seen in ranks.items() if seen.report.state == "stopped")
    if stopped:
        parts.append(f"stopped (SIGSTOP): rank {', '.join(map(str, stopped))}")
    return "; ".join(parts)


@dataclass(frozen=True)
class Straggler:
    rank: int
    worker: int
    slowdown: float
    signal: str  # "compute" or "step": which time per step was compared


def stragglers(memory: Memory, policy: Stragglers) -> list[Straggler]:
    """Ranks slow in each of their last `policy.reports` reports, slowest first. Judged
    on the ranks' compute_history where the rank and another one carry enough of it
    (`_history_slowdown`), else on the consecutive fresh polls `observe` counted."""
    recent = {
        rank: seen.report.compute_history[-policy.reports :]
        for rank, seen in memory.ranks.items()
        if len(seen.report.compute_history) >= policy.reports
    }
    counted = "compute" if _uses_compute(memory.ranks.values()) else "step"
    named = []
    for rank, seen in memory.ranks.items():
        judged = _history_slowdown(rank, recent)
        if judged is not None:
            lowest, typical = judged
            if lowest >= policy.slowdown:
                named.append(Straggler(rank, seen.worker, typical, "compute"))
        elif seen.slow >= policy.reports and seen.slowdown is not None:
            named.append(Straggler(rank, seen.worker, seen.slowdown, counted))
    return sorted(named, key=lambda s: (-s.slowdown, s.rank))


def _history_slowdown(
    rank: int, recent: Mapping[int, Sequence[float]]
) -> tuple[float, float] | None:
    """(lowest, median) of the rank's recent compute times over the median of the other
    ranks' (each other rank counted once, by the median of its own recent values, so
    one noisy rank moves the yardstick no more than one quiet one); None without the
    rank's history or any other rank's. Named only when even the lowest is slow: a
    noisy rank, slow in some reports and not in others, is not a straggler."""
    own = recent.get(rank)
    others = [median(values) for other, values in recent.items() if other != rank]
    if not own or not others:
        return None
    typical = median(others)
    if typical <= 0:
        return None
    return min(own) / typical, median(own) / typical


def _uses_compute(ranks: Iterable[RankSeen]) -> bool:
    reports = [seen.report for seen in ranks]
    return bool(reports) and all(r.compute_seconds is not None for r in reports)


def _signals(ranks: Mapping[int, RankReport]) -> dict[int, float]:
    """Each rank's time per step: compute time when every rank measures it (collectives
    excluded, so a slow rank does not make the others look slow while they wait for it),
    else wall time per step (in synchronous data parallelism every rank waits for the
    slowest, so this names a straggler only where ranks do not synchronize every step)."""
    if ranks and all(r.compute_seconds is not None for r in ranks.values()):
        return {rank: r.compute_seconds for rank, r in ranks.items() if r.compute_seconds}
    return {rank: r.step_seconds for rank, r in ranks.items() if r.step_seconds}


def _slowdown(rank: int, signals: Mapping[int, float]) -> float | None:
    """The rank's time per step over the median of the other ranks'; None when either
    is unknown (a single rank has no gang to be slower than)."""
    own = signals.get(rank)
    others = [value for other, value in signals.items() if other != rank]
    if own is None or not others:
        return None
    typical = median(others)
    return own / typical if typical > 0 else None


@dataclass
class _Tally:
    """The counting fields of status.goodput while they are updated."""

    productive: float
    highest: int | None
    restarts: int
    causes: dict[str, int]
    lost: int
    recovery: float | None


def account(
    previous: GoodputStatus | None,
    memory: Memory,
    reports: Mapping[int, WorkerReport],
    now: datetime,
    *,
    start_time: datetime | None,
    attempt_start_time: datetime | None,
) -> GoodputStatus | None:
    """status.goodput after these reports: `previous` itself when nothing it counts moved
    (the wall clock alone never rewrites the status), None before any rank reported."""
    steps = [seen.report.step for seen in memory.ranks.values() if seen.report.step is not None]
    if not steps or start_time is None:
        return previous
    found = previous or GoodputStatus()
    tally = _Tally(
        found.productive_seconds,
        found.highest_step,
        found.in_place_restarts,
        dict(found.in_place_restart_causes),
        found.steps_lost,
        found.last_recovery_seconds,
    )
    counted = found.counted
    if counted is None or counted.attempt != memory.attempt:
        if counted is not None and tally.highest is not None:
            # A recreated gang resumes from a checkpoint: its first steps seen bound the
            # steps done again from below.
            tally.lost += max(0, tally.highest - min(steps))
            if attempt_start_time is not None:
                first = min(seen.seen_at for seen in memory.ranks.values())
                tally.recovery = _round((first - attempt_start_time).total_seconds())
        counted = GoodputAttempt(attempt=memory.attempt)
    wall = max(0.0, (now - start_time).total_seconds())
    step = max(steps)
    if tally.highest is None or step > tally.highest:
        per_step = _median_step_seconds(memory)
        if per_step is not None:
            new_steps = step - (tally.highest or 0)
            tally.productive = min(wall, tally.productive + new_steps * per_step)
        tally.highest = step
    counted = _in_place(tally, counted, [r.restarts for r in reports.values() if r.restarts])
    unchanged = (
        previous is not None
        and counted == previous.counted
        and (tally.productive, tally.highest, tally.restarts, tally.causes, tally.lost)
        == (
            previous.productive_seconds,
            previous.highest_step,
            previous.in_place_restarts,
            previous.in_place_restart_causes,
            previous.steps_lost,
        )
        and tally.recovery == previous.last_recovery_seconds
    )
    if unchanged:
        return previous
    status = GoodputStatus(
        ratio=_round(min(1.0, tally.productive / wall)) if wall > 0 else None,
        productive_seconds=_round(tally.productive),
        wall_seconds=_round(wall),
        highest_step=tally.highest,
        in_place_restarts=tally.restarts,
        in_place_restart_causes=tally.causes,
        steps_lost=tally.lost,
        last_recovery_seconds=tally.recovery,
        counted=counted,
    )
    return status.model_copy(update={"summary": _summary(status)})


def _in_place(
    tally: _Tally, counted: GoodputAttempt, restarts: Sequence[RestartReport]
) -> GoodputAttempt:
    """Add this attempt's in-place restarts not counted yet. Every launcher of the gang
    sees each gang restart (its agent restarts too, cause "peer" where another worker's
    process failed), so the gang's count is the highest any launcher reports, and so is
    each cause's; a report missing from one poll lowers nothing. Of several restarts
    between two polls, only the last one's lost steps are known."""
    if not restarts:
        return counted
    total = max(counted.in_place_restarts, *(r.count for r in restarts))
    causes = dict(counted.causes)
    for cause in ("failure", "hang"):
        count = max(r.causes.get(cause, 0) for r in restarts)
        if count > causes.get(cause, 0):
            tally.causes[cause] = tally.causes.get(cause, 0) + count - causes.get(cause, 0)
            causes[cause] = count
    tally.restarts += total - counted.in_place_restarts
    lost_through = counted.lost_counted_through
    last = _gang_last(restarts, total)
    if last is not None:
        if total > lost_through and last.step_before is not None and last.resumed_from is not None:
            tally.lost += max(0, last.step_before - last.resumed_from)
            lost_through = total
        if last.at is not None and last.first_step_at is not None:
            tally.recovery = _round(max(0.0, last.first_step_at - last.at))
    return GoodputAttempt(
        attempt=counted.attempt,
        in_place_restarts=total,
        causes=causes,
        lost_counted_through=lost_through,
    )


def _gang_last(restarts: Sequence[RestartReport], total: int) -> InPlaceRestart | None:
    """The gang's last restart: as told by a launcher that counted it, preferably the one
    whose own process caused it (its step_before is its own)."""
    told = [r.last for r in restarts if r.count == total and r.last is not None]
    return min(told, key=lambda last: last.cause == "peer", default=None)


def _median_step_seconds(memory: Memory) -> float | None:
    found = [s.report.step_seconds for s in memory.ranks.values() if s.report.step_seconds]
    return median(found) if found else None


def _summary(status: GoodputStatus) -> str:
    parts = [f"{status.ratio:.0%}" if status.ratio is not None else "n/a"]
    if status.in_place_restarts:
        parts.append(f"{status.in_place_restarts} in-place restart(s)")
    if status.steps_lost:
        parts.append(f"{status.steps_lost} steps lost")
    if status.last_recovery_seconds is not None:
        parts.append(f"last recovery {status.last_recovery_seconds:.0f}s")
    return ", ".join(parts)


def _round(value: float) -> float:
    # Three decimals: enough for people, and a status that does not move by noise.
    return round(value, 3)
