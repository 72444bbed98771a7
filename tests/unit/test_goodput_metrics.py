"""Goodput metrics count each hang, straggler and in-place restart once per written status."""

from __future__ import annotations

import pytest
from factories import NOW

from trainwave.api.reasons import Reason
from trainwave.api.status import Condition, ConditionType, GoodputStatus, TrainingJobStatus
from trainwave.controller import metrics
from trainwave.controller.goodput_metrics import record_goodput
from trainwave.lifecycle.draft import Decision, JobEvent

pytestmark = pytest.mark.timeout(20)


def hung(status: str) -> Condition:
    return Condition(type=ConditionType.HUNG, status=status, last_transition_time=NOW)


def value(counter: object, *labels: str) -> float:
    child = counter.labels(*labels) if labels else counter  # type: ignore[attr-defined]
    return float(child._value.get())


def test_a_hang_is_counted_when_the_condition_turns_true_not_again_at_recreation() -> None:
    before = value(metrics.HANGS)
    quiet = TrainingJobStatus()
    found = TrainingJobStatus(conditions=[hung("True")])
    record_goodput(quiet, Decision(found, events=(JobEvent("Warning", Reason.HUNG, "m"),)))
    recreated = TrainingJobStatus(conditions=[hung("False")], restarts=1)
    record_goodput(found, Decision(recreated, events=(JobEvent("Warning", Reason.HUNG, "r"),)))
    assert value(metrics.HANGS) == before + 1


def test_stragglers_and_in_place_restarts_by_cause() -> None:
    stragglers, failures = value(metrics.STRAGGLERS), value(metrics.IN_PLACE_RESTARTS, "failure")
    old = TrainingJobStatus(goodput=GoodputStatus(in_place_restart_causes={"failure": 1}))
    new = TrainingJobStatus(
        goodput=GoodputStatus(in_place_restart_causes={"failure": 3, "meteor": 9})
    )
    events = (JobEvent("Warning", Reason.STRAGGLER, "rank 1"),) * 2
    record_goodput(old, Decision(new, events=events))
    assert value(metrics.STRAGGLERS) == stragglers + 2
    assert value(metrics.IN_PLACE_RESTARTS, "failure") == failures + 2
    assert "meteor" not in str(metrics.IN_PLACE_RESTARTS.collect())
