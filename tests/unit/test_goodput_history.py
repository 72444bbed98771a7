"""Stragglers judged on each rank's compute_history (lifecycle/goodput.py, issue 26 item 4).

The runtime reports every telemetry interval, the operator polls every status interval
(15 s by default): a rank slowed 2x must be named at the first poll after `reports`
slow REPORTS, not after `reports` polls.
"""

from __future__ import annotations

from typing import Any

import pytest
from factories import NOW

from trainwave.api.run_policy import Stragglers
from trainwave.lifecycle.goodput import Memory, observe, stragglers
from trainwave.lifecycle.reports import MAX_HISTORY, WorkerReport, read_ranks, read_report

pytestmark = pytest.mark.timeout(20)

POLICY = Stragglers(slowdown=1.5, reports=3)


def rank(history: list[Any] | None, *, step: int = 10, time: float = 1000.0) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "step": step,
        "time": time,
        "step_seconds": 0.3,
        "compute_seconds": history[-1] if history else 0.1,
        "generation": 0,
        "state": "running",
    }
    if history is not None:
        entry["compute_history"] = history
    return entry


def gang(
    *histories: list[Any] | None, step: int = 10, time: float = 1000.0
) -> dict[int, WorkerReport]:
    """One rank per worker, rank i on worker i, with the given compute_history."""
    reports = {}
    for i, history in enumerate(histories):
        report = read_report(
            {"node_rank": i, "ranks": {str(i): rank(history, step=step, time=time)}}
        )
        assert report is not None
        reports[i] = report
    return reports


def one_poll(*histories: list[Any] | None) -> Memory:
    return observe(None, 0, gang(*histories), NOW, POLICY)


NORMAL = [0.1] * 10


def test_with_two_ranks_a_rank_twice_as_slow_is_named_at_the_first_poll() -> None:
    # Its last 3 reports (1 s apart in the runtime) were slow: one poll sees them all.
    [named] = stragglers(one_poll(NORMAL, [0.1] * 7 + [0.2, 0.2, 0.2]), POLICY)
    assert (named.rank, named.worker, named.signal) == (1, 1, "compute")
    assert named.slowdown == pytest.approx(2.0)


def test_fewer_slow_reports_than_policy_reports_name_nobody() -> None:
    assert stragglers(one_poll(NORMAL, [0.1] * 8 + [0.2, 0.2]), POLICY) == []


def test_among_four_ranks_the_slow_one_is_compared_with_the_median_of_the_others() -> None:
    memory = one_poll([0.1, 0.1, 0.1], [0.12, 0.11, 0.12], [0.1, 0.09, 0.1], [0.3, 0.29, 0.31])
    [named] = stragglers(memory, POLICY)
    assert named.rank == 3
    assert named.slowdown == pytest.approx(0.3 / 0.1)


def test_noisy_ranks_are_not_named() -> None:
    # Slow in some reports and not in others (a data-loader hiccup, a GC pause): not a
    # straggler, even when its median is high.
    noisy = [0.1, 0.25, 0.1, 0.25, 0.25, 0.1]
    jittery = [0.08, 0.13, 0.11]
    assert stragglers(one_poll([0.1, 0.1, 0.1], noisy, jittery, [0.1, 0.12, 0.09]), POLICY) == []


def test_a_rank_that_recovered_is_not_named_for_its_older_slow_reports() -> None:
    assert stragglers(one_poll(NORMAL, [0.2] * 7 + [0.1, 0.1, 0.1]), POLICY) == []


def test_a_slow_rank_is_named_even_when_the_others_are_noisy() -> None:
    memory = one_poll([0.1, 0.13, 0.08], [0.09, 0.12, 0.1], [0.25, 0.22, 0.3])
    assert [s.rank for s in stragglers(memory, POLICY)] == [2]


def test_without_history_fresh_polls_are_counted_as_before() -> None:
    # An older runtime sends no compute_history: `reports` fresh polls are needed.
    memory = None
    for n in range(3):
        reports = gang(None, None, step=10 + n, time=1000.0 + n)
        slow = read_report({"node_rank": 1, "ranks": {"1": {**rank(None, step=10 + n,
                            time=1000.0 + n), "compute_seconds": 0.2}}})  # fmt: skip
        assert slow is not None
        reports[1] = slow
        memory = observe(memory, 0, reports, NOW, POLICY)
        named = stragglers(memory, POLICY)
        assert [s.rank for s in named] == ([1] if n == 2 else [])


def test_history_on_one_rank_only_falls_back_to_counting() -> None:
    # Rank 0 has history, rank 1 none: neither has another rank's history to be compared
    # with, so one poll names nobody.
    assert stragglers(one_poll([0.1] * 5, None), POLICY) == []
    assert stragglers(one_poll(None, [0.3] * 5), POLICY) == []


@pytest.mark.parametrize(
    "history",
    [
        "0.1,0.2",
        [0.1, "0.2"],
        [0.1, None],
        [0.1, 0.0],
        [0.1, -1.0],
        [0.1, float("nan")],
        [0.1, True],
        [0.1] * (MAX_HISTORY + 1),
        {"0": 0.1},
    ],
    ids=["string", "string-item", "null", "zero", "negative", "nan", "bool", "too-long", "dict"],
)
def test_a_malformed_history_reads_as_none(history: Any) -> None:
    [report] = read_ranks({"0": {"step": 1, "compute_history": history}}).values()
    assert report.compute_history == ()


def test_a_good_history_is_read_oldest_first() -> None:
    [report] = read_ranks({"0": {"step": 1, "compute_history": [0.1, 2, 0.3]}}).values()
    assert report.compute_history == (0.1, 2.0, 0.3)
    [full] = read_ranks({"0": {"compute_history": [0.1] * MAX_HISTORY}}).values()
    assert len(full.compute_history) == MAX_HISTORY
