"""The fault benchmark's arithmetic: recovery, steps lost, healthy step time, goodput."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.fault_analysis import (
    StepRecord,
    goodput,
    healthy_step_seconds,
    read_steps,
    recovery,
)
from benchmarks.fault_report import instant_repair_goodput


def steps(
    first: int, last: int, t0: float, dt: float, *, gen: int = 0, attempt: int = 0
) -> list[StepRecord]:
    return [StepRecord(s, t0 + (s - first) * dt, gen, attempt) for s in range(first, last + 1)]


def test_an_in_place_restart_resumes_from_the_checkpoint_and_loses_the_steps_after_it() -> None:
    # Steps 1-47 in generation 0, a kill at t=47.05, generation 1 resumes after step 40.
    records = steps(1, 47, 1.0, 1.0) + steps(41, 60, 55.0, 1.0, gen=1)
    found = recovery(records, fault_at=47.05)
    assert found.last_step_before == 47
    assert found.resumed_from == 40
    assert found.steps_lost == 7
    assert found.seconds == pytest.approx(55.0 - 47.05)


def test_a_recreated_gang_counts_by_attempt_even_when_generations_repeat() -> None:
    records = steps(1, 30, 1.0, 1.0) + steps(21, 40, 100.0, 1.0, gen=0, attempt=1)
    found = recovery(records, fault_at=30.5)
    assert (found.resumed_from, found.steps_lost) == (20, 10)
    assert found.first_new_at == 100.0


def test_steps_of_the_old_processes_after_the_fault_are_not_the_recovery() -> None:
    # A stopped rank's peers may finish the step in flight after the fault.
    records = steps(1, 10, 1.0, 1.0) + steps(11, 15, 30.0, 1.0, gen=1)
    found = recovery(records, fault_at=9.5)
    assert found.last_step_before == 9
    assert found.first_new_at == 30.0
    assert found.steps_lost == 0  # resumed at 10, the last step finished before the fault was 9


def test_no_recovery_yet() -> None:
    found = recovery(steps(1, 10, 1.0, 1.0), fault_at=10.5)
    assert found.first_new_at is None
    assert found.seconds is None
    assert found.steps_lost is None


def test_healthy_step_time_skips_restarts_and_gaps_around_faults() -> None:
    records = steps(1, 10, 0.0, 0.5) + steps(5, 10, 100.0, 0.5, gen=1)
    assert healthy_step_seconds(records, faults=[4.6]) == pytest.approx(0.5)
    assert healthy_step_seconds([], faults=[]) is None


def test_goodput_is_distinct_steps_times_step_time_over_wall() -> None:
    records = steps(1, 10, 10.0, 1.0) + steps(6, 10, 40.0, 1.0, gen=1)
    # 10 distinct steps of 1 s; wall from 0 to the last step at 44.
    assert goodput(records, started_at=0.0, step_seconds=1.0) == pytest.approx(10 / 44)
    assert goodput([], started_at=0.0, step_seconds=1.0) == 0.0


def test_a_torn_last_line_is_skipped(tmp_path: Path) -> None:
    log = tmp_path / "rank0.jsonl"
    good = {"step": 1, "t": 2.5, "gen": 0, "attempt": 3}
    log.write_text(json.dumps(good) + "\n" + '{"step": 2, "t": 3')
    assert read_steps(log) == [StepRecord(1, 2.5, 0, 3)]
    assert read_steps(tmp_path / "missing.jsonl") == []


def test_detection_is_a_count_going_up_or_hung_turning_true() -> None:
    from benchmarks.fault_injection import first_change_after

    def view(attempt=0, restarts=0, in_place=None, hung=None):
        conditions = {} if hung is None else {"Hung": (hung, "")}
        return {"attempt": attempt, "restarts": restarts, "in_place": in_place,
                "conditions": conditions}  # fmt: skip

    changes = [(0.0, view()), (5.0, view(in_place=0)), (9.0, view(hung="False")),
               (20.0, view(in_place=0, hung="True")), (30.0, view(attempt=1, restarts=1))]  # fmt: skip
    assert first_change_after(changes, 1.0) == 20.0  # None -> 0 and Hung False are not news
    assert first_change_after(changes, 25.0) == 30.0
    assert first_change_after(changes, -1.0) is None  # nothing known before the fault
    # a drain repaired by replacing one worker keeps the attempt: its counts tell it
    drained = [(0.0, view()), (4.0, {**view(), "disruptions": 1, "replacements": 1})]
    assert first_change_after(drained, 1.0) == 4.0


def test_a_drain_takes_a_whole_worker_any_of_them_and_leaves_the_other_faults_as_they_were() -> (
    None
):
    from benchmarks import bench_faults
    from benchmarks.fault_report import victim

    processes = bench_faults.PROCESSES
    drained = set()
    for seed in range(50):
        faults = dict(bench_faults.schedule(seed))
        assert faults["drain"] % processes == 0  # the worker's first rank
        drained.add(faults["drain"] // processes)
        assert (
            victim("drain", faults["drain"], processes) == f"worker {faults['drain'] // processes}"
        )
    assert drained == set(range(bench_faults.WORKERS))  # worker 0 (the store's host) too
    # the drain comes last, so the seed picks the same ranks for the others as before it
    import random

    chooser = random.Random(26)
    earlier = [chooser.randrange(bench_faults.WORKERS * processes) for _ in range(3)]
    assert [rank for kind, rank in bench_faults.schedule(26)[:3]] == earlier
    assert victim("kill", 3, processes) == "rank 3"


def test_the_instant_repair_ceiling_keeps_what_the_schedule_forces() -> None:
    """100 s productive in 160 s; a kill repaired in 4 s losing 10 steps of 0.1 s, a stop
    repaired 25 s after it with a 20 s hang timeout: 4 + 1 + 5 s come back, the slowed rank
    and the timeout do not."""
    run = {
        "goodput": 100 / 160,
        "wall_seconds": 160.0,
        "healthy_step_seconds": 0.1,
        "faults": [
            {"kind": "kill", "recovery_seconds": 4.0, "steps_lost": 10},
            {"kind": "stop", "recovery_seconds": 25.0, "steps_lost": 0},
            {"kind": "slow"},
        ],
    }
    assert instant_repair_goodput(run, hang_timeout=20) == pytest.approx(100 / 150)
    run["faults"][0]["recovery_seconds"] = None
    assert instant_repair_goodput(run, hang_timeout=20) is None
