"""The chaos suite's oracle (tests/chaos/plan.py), without a cluster: what each kind of job
must end as, given the disruptions that hit it, and that a wrong end is reported."""

from __future__ import annotations

import pytest

from chaos.plan import FAULTS, JobPlan, expect, expected_pods, make_plan, violations

pytestmark = pytest.mark.timeout(10)


def make_job(kind: str, budget: int = 0, workers: int = 2) -> JobPlan:
    return JobPlan(name=f"{kind}-00", kind=kind, workers=workers, gpus=2, run_for=8, budget=budget)


@pytest.mark.parametrize(
    ("kind", "budget", "hits", "end", "counters"),
    [
        ("ok", 0, 0, ("Succeeded", "Succeeded"), {"disruptions": 0, "attempt": 0}),
        ("ok", 0, 2, ("Succeeded", "Succeeded"), {"disruptions": 2, "attempt": 2}),
        ("fragile", 0, 0, ("Succeeded", "Succeeded"), {"disruptions": 0, "attempt": 0}),
        ("fragile", 0, 1, ("Failed", "MaxDisruptionsExceeded"), {"disruptions": 0, "attempt": 0}),
        ("flaky", 2, 0, ("Failed", "MaxRestartsExceeded"), {"restarts": 2, "attempt": 2}),
        ("flaky", 1, 1, ("Failed", "MaxRestartsExceeded"),
         {"restarts": 1, "disruptions": 1, "attempt": 2}),
        ("fatal", 0, 1, ("Failed", "FailedByRule"), {"disruptions": 1, "attempt": 1}),
        ("oom", 0, 0, ("Failed", "FailedByRule"), {"attempt": 0}),
        ("ignored", 1, 0, ("Failed", "MaxIgnoredRestartsExceeded"),
         {"ignoredRestarts": 1, "attempt": 1}),
    ],
    ids=["ok", "ok-hit-twice", "fragile", "fragile-hit", "flaky", "flaky-hit", "fatal-hit",
         "oom", "ignored"],
)  # fmt: skip
def test_expectation_per_kind(kind, budget, hits, end, counters):
    expected = expect(make_job(kind, budget), hits)
    assert (expected.phase, expected.reason) == end
    got = expected.counters()
    assert {k: got[k] for k in counters} == counters
    assert got["preemptions"] == 0


def test_every_attempt_creates_its_whole_gang():
    assert expected_pods(make_job("ok", workers=2), 2) == {
        "ok-00-a0-worker-0", "ok-00-a0-worker-1", "ok-00-a1-worker-0", "ok-00-a1-worker-1",
    }  # fmt: skip


def test_a_wrong_end_is_reported_field_by_field():
    job = make_job("flaky", budget=1)
    expected = expect(job, 1)
    status = {"phase": "Failed", "reason": "MaxRestartsExceeded", "restarts": 2,
              "disruptions": 0, "attempt": 2}  # fmt: skip
    found = violations(job, expected, status, expected_pods(job, 3) | {"flaky-00-a3-worker-0"})
    assert found == [
        "flaky-00: restarts 2, expected 1",
        "flaky-00: disruptions 0, expected 1",
        "flaky-00: pods extra ['flaky-00-a3-worker-0'], missing []",
    ]
    assert violations(job, expected, {**status, "restarts": 1, "disruptions": 1},
                      expected_pods(job, 3)) == []  # fmt: skip


def test_the_plan_is_a_function_of_the_seed():
    first, again, other = make_plan(7), make_plan(7), make_plan(8)
    assert first == again
    assert first != other
    assert len(first.jobs) >= 50
    assert first.fault_counts() == FAULTS
    assert len({j.name for j in first.jobs}) == len(first.jobs)
