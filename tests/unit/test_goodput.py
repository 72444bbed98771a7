"""Goodput decisions (lifecycle/goodput.py): hang, stragglers and status.goodput, pure."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from factories import NOW, ago

from trainwave.api.run_policy import Stragglers
from trainwave.api.status import GoodputStatus
from trainwave.lifecycle.goodput import Memory, account, judge_hang, observe, stragglers
from trainwave.lifecycle.reports import WorkerReport, read_report

pytestmark = pytest.mark.timeout(20)

POLICY = Stragglers(slowdown=1.5, reports=3)


def rank(step: int | None = 10, *, time: float = 1000.0, compute: float | None = 0.1,
         step_seconds: float | None = 0.2, generation: int = 0,
         state: str = "running") -> dict[str, Any]:  # fmt: skip
    return {"step": step, "time": time, "compute_seconds": compute,
            "step_seconds": step_seconds, "generation": generation, "state": state}  # fmt: skip


def worker(node_rank: int, ranks: dict[int, dict[str, Any]], **extra: Any) -> WorkerReport:
    document = {"node_rank": node_rank, "ranks": {str(r): v for r, v in ranks.items()}, **extra}
    report = read_report(document)
    assert report is not None
    return report


def gang(*steps: int, compute: tuple[float, ...] = (), time: float = 1000.0,
         **options: Any) -> dict[int, WorkerReport]:  # fmt: skip
    """One rank per worker, rank i on worker i."""
    times = compute or tuple(0.1 for _ in steps)
    return {
        i: worker(i, {i: rank(s, compute=c, time=time, **options)})
        for i, (s, c) in enumerate(zip(steps, times, strict=True))
    }


def seen(reports: dict[int, WorkerReport], *, at: Any = NOW, memory: Memory | None = None,
         attempt: int = 0, **options: Any) -> Memory:  # fmt: skip
    return observe(memory, attempt, reports, at, POLICY, **options)


# --- hang -------------------------------------------------------------------------------


def test_first_sight_starts_the_operators_clock_and_an_unmoved_step_keeps_it() -> None:
    first = seen(gang(10, 10), at=ago(100))
    again = seen(gang(10, 10, time=1005.0), at=NOW, memory=first)
    assert {s.seen_at for s in again.ranks.values()} == {ago(100)}
    moved = seen(gang(11, 10), at=NOW, memory=first)
    assert moved.ranks[0].seen_at == NOW
    assert moved.ranks[1].seen_at == ago(100)


def test_a_new_generation_at_the_same_step_is_progress() -> None:
    # An in-place restart that resumed exactly at the step it left: the agents made a
    # new generation, which is the repair the Hung condition waits for.
    first = seen(gang(10), at=ago(100))
    restarted = seen(gang(10, generation=1), at=NOW, memory=first)
    assert restarted.ranks[0].seen_at == NOW


def test_a_generation_restarted_in_place_is_judged_from_its_first_step() -> None:
    # The launcher counts the restart at once; the new processes report their first step
    # only after imports, rendezvous and the checkpoint. That start is judged as the first
    # generation's is: not at all until its first step, however long it takes (on loaded
    # cores a restart outlasted a 20 s timeout and read Hung).
    restarts = {"restarts": {"count": 1, "causes": {"hang": 1}}}
    first = seen({0: worker(0, {0: rank(10)}), 1: worker(1, {1: rank(10)})}, at=ago(200))
    restarted = seen(
        {0: worker(0, {0: rank(10)}, **restarts), 1: worker(1, {1: rank(10)})},
        at=ago(100),
        memory=first,
    )
    assert restarted.ranks[0].seen_at == ago(100)
    assert restarted.ranks[1].seen_at == ago(200)
    # Long past the timeout, from a job found hung: still not hung, nothing recreated.
    verdict = judge_hang(restarted, 20, NOW, ago(50))
    assert verdict is not None
    assert not verdict.hung
    assert not verdict.recreate
    assert verdict.message.startswith("rank 0's processes restarted in place")
    assert verdict.recheck_after == pytest.approx(20)
    # Its first step ends the start; from then on the timeout holds again.
    stepped = seen(
        {0: worker(0, {0: rank(11, generation=1)}, **restarts), 1: worker(1, {1: rank(10)})},
        at=ago(30),
        memory=restarted,
    )
    assert not stepped.ranks[0].restarted
    again = judge_hang(stepped, 20, NOW, None)
    assert again is not None
    assert again.hung
    assert "stalled ranks: 0 (step 11), 1 (step 10)" in again.message


@pytest.mark.parametrize(
    ("timeout", "reports"),
    [(None, gang(10, 10)), (60, gang(None, None)), (60, {})],
    ids=["no-timeout", "no-step-yet", "no-reports"],
)
def test_hang_is_not_judged_without_a_timeout_or_a_first_step(timeout, reports) -> None:
    assert judge_hang(seen(reports, at=ago(600)), timeout, NOW, None) is None


def test_quiet_shorter_than_the_timeout_is_not_a_hang_and_asks_to_look_again() -> None:
    verdict = judge_hang(seen(gang(10, 10), at=ago(20)), 60, NOW, None)
    assert verdict is not None
    assert not verdict.hung
    assert verdict.recheck_after == pytest.approx(40)


def test_a_hang_names_every_stalled_rank_the_one_behind_and_the_stopped_one() -> None:
    reports = {
        0: worker(0, {0: rank(120), 1: rank(120)}),
        1: worker(1, {2: rank(118, state="stopped"), 3: rank(120)}),
    }
    verdict = judge_hang(seen(reports, at=ago(61)), 60, NOW, None)
    assert verdict is not None
    assert verdict.hung
    assert not verdict.recreate
    assert "stalled ranks: 0 (step 120), 1 (step 120), 2 (step 118), 3 (step 120)" in (
        verdict.message
    )
    assert "rank 2 is behind at step 118" in verdict.message
    assert "stopped (SIGSTOP): rank 2" in verdict.message


def test_one_rank_still_moving_means_the_gang_is_not_hung() -> None:
    first = seen(gang(10, 10), at=ago(100))
    memory = seen(gang(10, 11), at=ago(5), memory=first)
    verdict = judge_hang(memory, 60, NOW, None)
    assert verdict is not None
    assert not verdict.hung
    assert verdict.message == "rank 1 completed step 11"


def test_a_hang_that_persists_a_full_timeout_after_the_condition_recreates_the_gang() -> None:
    memory = seen(gang(10, 10), at=ago(200))
    waiting = judge_hang(memory, 60, NOW, ago(30))
    assert waiting is not None
    assert waiting.hung
    assert not waiting.recreate
    assert waiting.recheck_after == pytest.approx(30)
    due = judge_hang(memory, 60, NOW, ago(60))
    assert due is not None
    assert due.recreate


def test_after_an_operator_restart_a_hung_job_stays_hung() -> None:
    # No memory: each rank is first seen now. With the job already Hung since 30 s ago
    # its last step is known to be older than that minus the timeout.
    memory = seen(gang(10, 10), at=NOW, stalled_since=ago(30 + 60))
    verdict = judge_hang(memory, 60, NOW, ago(30))
    assert verdict is not None
    assert verdict.hung


@pytest.mark.parametrize("skew", [-3600.0, 0.0, 7200.0], ids=["behind", "none", "ahead"])
def test_worker_clocks_do_not_decide_staleness(skew: float) -> None:
    # A worker whose clock is an hour behind (or two ahead) but whose steps move is not
    # hung; one whose clock looks fresh but whose step never moves is.
    first = seen(gang(10, time=1000.0 + skew), at=ago(100))
    moving = seen(gang(11, time=1001.0 + skew), at=ago(1), memory=first)
    assert not judge_hang(moving, 60, NOW, None).hung  # type: ignore[union-attr]
    stuck = seen(gang(10, time=NOW.timestamp() + skew), at=NOW, memory=first)
    assert judge_hang(stuck, 60, NOW, None).hung  # type: ignore[union-attr]


# --- stragglers ---------------------------------------------------------------------------


def reports_in_a_row(count: int, compute: tuple[float, ...], **options: Any) -> Memory:
    memory = None
    for n in range(count):
        memory = seen(
            gang(*(10 + n for _ in compute), compute=compute, time=1000.0 + n, **options),
            memory=memory,
        )
    assert memory is not None
    return memory


def test_with_two_ranks_a_rank_twice_as_slow_is_named_after_n_fresh_reports() -> None:
    # The median of the OTHER ranks: the gang's median of (0.1, 0.2) is 0.15 and would
    # make the 2x rank look 1.33x.
    assert stragglers(reports_in_a_row(2, (0.1, 0.2)), POLICY) == []
    [named] = stragglers(reports_in_a_row(3, (0.1, 0.2)), POLICY)
    assert (named.rank, named.worker, named.slowdown, named.signal) == (1, 1, 2.0, "compute")


def test_the_same_report_seen_again_is_not_counted_twice() -> None:
    memory = reports_in_a_row(2, (0.1, 0.2))
    for _ in range(5):
        memory = seen(gang(11, 11, compute=(0.1, 0.2), time=1001.0), memory=memory)
    assert memory.ranks[1].slow == 2
    assert stragglers(memory, POLICY) == []


def test_one_report_at_normal_speed_starts_the_count_again() -> None:
    memory = reports_in_a_row(2, (0.1, 0.2))
    memory = seen(gang(20, 20, compute=(0.1, 0.1), time=2000.0), memory=memory)
    memory = seen(gang(21, 21, compute=(0.1, 0.2), time=2001.0), memory=memory)
    assert memory.ranks[1].slow == 1


def test_among_four_ranks_the_slow_one_is_compared_with_the_median_of_the_others() -> None:
    [named] = stragglers(reports_in_a_row(3, (0.1, 0.12, 0.1, 0.3)), POLICY)
    assert named.rank == 3
    assert named.slowdown == pytest.approx(3.0)


def test_below_the_slowdown_nobody_is_named() -> None:
    assert stragglers(reports_in_a_row(5, (0.1, 0.14)), POLICY) == []


def test_without_compute_times_on_every_rank_wall_time_per_step_is_compared() -> None:
    memory = None
    for n in range(3):
        reports = {
            0: worker(0, {0: rank(10 + n, time=n, compute=0.1, step_seconds=0.2)}),
            1: worker(1, {1: rank(10 + n, time=n, compute=None, step_seconds=0.5)}),
        }
        memory = seen(reports, memory=memory)
    assert memory is not None
    [named] = stragglers(memory, POLICY)
    assert (named.rank, named.signal, named.slowdown) == (1, "step", 2.5)


@pytest.mark.parametrize(
    "reports",
    [
        {0: worker(0, {0: rank(10, compute=5.0)})},
        {0: worker(0, {0: rank(10, compute=None, step_seconds=None)}),
         1: worker(1, {1: rank(10, compute=None, step_seconds=None)})},
    ],
    ids=["one-rank", "no-times"],
)  # fmt: skip
def test_no_straggler_without_a_gang_to_compare_with(reports) -> None:
    memory = None
    for _ in range(5):
        memory = seen(reports, memory=memory)
        reports = {k: worker(k, {r: {**rank(), "time": 1.0 + (memory.ranks[r].report.time or 0)}
                                 for r in v.ranks}) for k, v in reports.items()}  # fmt: skip
    assert memory is not None
    assert stragglers(memory, POLICY) == []


def test_a_new_attempt_forgets_the_old_gangs_streaks() -> None:
    memory = reports_in_a_row(3, (0.1, 0.2))
    fresh = seen(gang(1, 1, compute=(0.1, 0.2), time=5000.0), memory=memory, attempt=1)
    assert fresh.ranks[1].slow == 1


# --- status.goodput ----------------------------------------------------------------------


def goodput_of(  # noqa: PLR0917 (the decision's arguments, in order, for short tables)
    previous: GoodputStatus | None,
    memory: Memory,
    reports: dict[int, WorkerReport],
    now: datetime,
    start: datetime,
    attempt_start: datetime,
) -> GoodputStatus | None:
    return account(
        previous, memory, reports, now, start_time=start, attempt_start_time=attempt_start
    )


def test_productive_time_counts_each_new_step_at_the_gangs_median_time_per_step() -> None:
    memory = seen(gang(100, 100, step_seconds=0.5), at=NOW)
    goodput = goodput_of(None, memory, gang(100, 100), NOW, ago(100), ago(100))
    assert goodput is not None
    assert (goodput.productive_seconds, goodput.wall_seconds, goodput.ratio) == (50.0, 100.0, 0.5)
    assert goodput.highest_step == 100
    assert goodput.summary == "50%"


def test_steps_done_again_after_a_restart_are_not_productive() -> None:
    memory = seen(gang(100, 100, step_seconds=0.5), at=ago(10))
    first = goodput_of(None, memory, gang(100, 100), ago(10), ago(110), ago(110))
    redone = seen(gang(90, 90, step_seconds=0.5, generation=1), at=NOW, memory=memory)
    later = goodput_of(first, redone, gang(90, 90), NOW, ago(110), ago(110))
    assert later is first  # nothing counted moved: the status is not rewritten


def test_nothing_new_returns_the_same_status_whatever_the_clock_says() -> None:
    memory = seen(gang(100, 100), at=ago(10))
    first = goodput_of(None, memory, gang(100, 100), ago(10), ago(110), ago(110))
    assert goodput_of(first, memory, gang(100, 100), NOW, ago(110), ago(110)) is first


def restarts(count: int, cause: str, *, failure: int = 0, hang: int = 0, peer: int = 0,
             before: int | None = 120, resumed: int | None = 100, at: float = 500.0,
             first_step_at: float | None = 508.5) -> dict[str, Any]:  # fmt: skip
    return {"count": count, "causes": {"failure": failure, "hang": hang, "peer": peer},
            "last": {"cause": cause, "at": at, "step_before": before, "resumed_from": resumed,
                     "first_step_at": first_step_at}}  # fmt: skip


def with_restarts(*per_worker: dict[str, Any]) -> dict[int, WorkerReport]:
    return {i: worker(i, {i: rank(101)}, restarts=r) for i, r in enumerate(per_worker)}


def test_an_in_place_restart_is_counted_once_by_its_own_cause_with_its_lost_steps() -> None:
    # Worker 0's process failed; worker 1's agent restarted its processes as a peer.
    reports = with_restarts(
        restarts(1, "failure", failure=1, at=500.0, first_step_at=508.5),
        restarts(1, "peer", peer=1, before=119, at=9000.0, first_step_at=9020.0),
    )
    memory = seen(reports)
    goodput = goodput_of(None, memory, reports, NOW, ago(600), ago(600))
    assert goodput is not None
    assert goodput.in_place_restarts == 1
    assert goodput.in_place_restart_causes == {"failure": 1}
    assert goodput.steps_lost == 20  # the failing worker's own 120 - 100
    assert goodput.last_recovery_seconds == 8.5  # one worker's clock, both ends
    assert "1 in-place restart(s), 20 steps lost, last recovery 8s" in goodput.summary
    again = goodput_of(goodput, memory, reports, NOW + timedelta(seconds=30), ago(600), ago(600))
    assert again is goodput


def test_lost_steps_wait_for_the_step_resumed_from_and_are_added_once() -> None:
    early = with_restarts(restarts(1, "hang", hang=1, resumed=None, first_step_at=None))
    goodput = goodput_of(None, seen(early), early, NOW, ago(600), ago(600))
    assert goodput is not None
    assert goodput.steps_lost == 0
    assert goodput.in_place_restart_causes == {"hang": 1}
    resumed = with_restarts(restarts(1, "hang", hang=1))
    later = goodput_of(goodput, seen(resumed), resumed, NOW, ago(600), ago(600))
    assert later is not None
    assert later.steps_lost == 20
    assert later.in_place_restarts == 1
    assert goodput_of(later, seen(resumed), resumed, NOW, ago(600), ago(600)) is later


def test_a_new_attempt_adds_its_own_restarts_and_the_recreations_lost_steps() -> None:
    reports = with_restarts(restarts(2, "failure", failure=2))
    before = goodput_of(None, seen(reports), reports, ago(60), ago(600), ago(600))
    assert before is not None
    assert before.in_place_restarts == 2
    # The gang was recreated (attempt 1): the launchers count from zero again, and the
    # new gang's first step seen is 90 where the old one reached 101.
    new_gang = {0: worker(0, {0: rank(90)}, restarts=restarts(1, "failure", failure=1))}
    memory = seen(new_gang, at=NOW, attempt=1)
    after = goodput_of(before, memory, new_gang, NOW, ago(600), ago(20))
    assert after is not None
    assert after.in_place_restarts == 3
    assert after.in_place_restart_causes == {"failure": 3}
    assert after.steps_lost == 20 + 11 + 20
    assert after.counted is not None
    assert after.counted.attempt == 1


def test_no_goodput_before_any_rank_reported_a_step() -> None:
    assert goodput_of(None, seen({}), {}, NOW, ago(10), ago(10)) is None
    previous = GoodputStatus(ratio=0.5)
    assert goodput_of(previous, seen({}), {}, NOW, ago(10), ago(10)) is previous
