"""Hung, Straggler and status.goodput through `decide`, and the reader of the new report keys."""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import Any

import pytest
from factories import NOW, ago, make_body, make_pod, running

from trainwave.api.reasons import Reason
from trainwave.api.status import ConditionType, Phase
from trainwave.api.trainingjob import TrainingJob, parse_trainingjob
from trainwave.lifecycle.decide import Decision, decide
from trainwave.lifecycle.goodput import Memory
from trainwave.lifecycle.reports import (
    InPlaceRestart,
    InPlaceSetting,
    RankReport,
    RestartReport,
    WorkerReport,
    read_report,
)
from trainwave.resolving import resolve_job

pytestmark = pytest.mark.timeout(20)


def report(node_rank: int, step: int, *, compute: float = 0.1, time: float = 1000.0,
           state: str = "running") -> WorkerReport:  # fmt: skip
    found = read_report({
        "node_rank": node_rank,
        "ranks": {str(node_rank): {"step": step, "time": time, "compute_seconds": compute,
                                   "step_seconds": 0.5, "generation": 0, "state": state}},
    })  # fmt: skip
    assert found is not None
    return found


def hung_condition(since: datetime) -> dict[str, Any]:
    return {"type": "Hung", "status": "True", "reason": "Hung", "message": "m",
            "lastTransitionTime": since.isoformat().replace("+00:00", "Z")}  # fmt: skip


def job(*, timeout: int | None = 60, conditions: tuple[dict[str, Any], ...] = (),
        stragglers: dict[str, Any] | None = None, in_place: int = 3,
        **options: Any) -> TrainingJob:  # fmt: skip
    """A Running job with hangTimeoutSeconds `timeout`, started 1000 s ago, with the runtime
    (whose reports these are) and `in_place` in-place restarts."""
    body = make_body(
        phase="Running",
        runtime={"inPlaceRestarts": in_place},
        command=["python", "train.py"],
        start_time=ago(1000),
        status_extra={
            "conditions": [
                {"type": "Running", "status": "True", "reason": "AllWorkersRunning"},
                *conditions,
            ],
            "attemptStartTime": ago(1000).isoformat(),
        },
        **options,
    )
    if timeout is not None:
        body["spec"]["runPolicy"]["hangTimeoutSeconds"] = timeout
    if stragglers is not None:
        body["spec"]["runPolicy"]["stragglers"] = stragglers
    return parse_trainingjob(body)


def decided(found_job: Any, reports: dict[int, WorkerReport], *, at: datetime = NOW,
            memory: Memory | None = None, pods: Any = None) -> Decision:  # fmt: skip
    return decide(resolve_job(found_job), pods or running(), at, reports=reports, memory=memory)


def stale_memory(steps: tuple[int, ...], since: datetime) -> Memory:
    first = decided(job(), {i: report(i, s) for i, s in enumerate(steps)}, at=since)
    assert first.memory is not None
    return first.memory


def test_a_gang_quiet_for_the_timeout_is_hung_with_an_event_and_a_recheck() -> None:
    memory = stale_memory((120, 118), ago(61))
    found = decided(job(), {0: report(0, 120), 1: report(1, 118, state="stopped")}, memory=memory)
    hung = found.status.condition(ConditionType.HUNG)
    assert hung is not None
    assert (hung.status, hung.reason) == ("True", "Hung")
    assert "stalled ranks: 0 (step 120), 1 (step 118)" in hung.message
    assert "rank 1 is behind at step 118" in hung.message
    assert "stopped (SIGSTOP): rank 1" in hung.message
    assert [(e.type, e.reason) for e in found.events] == [("Warning", Reason.HUNG)]
    assert found.requeue_after == pytest.approx(60)
    assert found.status.phase == Phase.RUNNING
    assert not found.delete_pods


def test_before_the_timeout_nothing_is_written_but_a_recheck_is_asked() -> None:
    memory = stale_memory((120, 120), ago(20))
    found = decided(job(), {0: report(0, 120), 1: report(1, 120)}, memory=memory)
    assert found.status.condition(ConditionType.HUNG) is None
    assert found.requeue_after == pytest.approx(40)


def test_without_hang_timeout_seconds_there_is_no_hang() -> None:
    memory = stale_memory((120, 120), ago(6000))
    found = decided(job(timeout=None), {0: report(0, 120), 1: report(1, 120)}, memory=memory)
    assert found.status.condition(ConditionType.HUNG) is None


def test_new_steps_clear_the_hung_condition_with_an_event() -> None:
    memory = stale_memory((120, 120), ago(100))
    hung_job = job(conditions=(hung_condition(ago(30)),))
    found = decided(hung_job, {0: report(0, 100, time=2000), 1: report(1, 100)}, memory=memory)
    hung = found.status.condition(ConditionType.HUNG)
    assert hung is not None
    assert (hung.status, hung.reason) == ("False", "ProgressResumed")
    assert "rank 0 completed step 100" in hung.message
    assert [e.reason for e in found.events] == [Reason.PROGRESS_RESUMED]


def test_still_hung_a_full_timeout_later_recreates_the_gang_counted_as_a_restart() -> None:
    memory = stale_memory((120, 120), ago(200))
    hung_job = job(conditions=(hung_condition(ago(60)),))
    found = decided(hung_job, {0: report(0, 120), 1: report(1, 120)}, memory=memory)
    assert found.status.phase == Phase.RESTARTING
    assert found.status.reason == Reason.HUNG
    assert (found.status.restarts, found.status.attempt) == (1, 1)
    assert set(found.delete_pods) == {p.name for p in running()}
    assert "still hung 60s after it was found hung" in found.status.message
    assert "restarting the gang (restart 1 of 3)" in found.status.message
    hung = found.status.condition(ConditionType.HUNG)
    assert hung is not None
    assert hung.status == "False"


def test_without_in_place_restarts_a_hang_recreates_the_gang_when_found() -> None:
    # No launcher watchdog runs without in-place restarts: waiting a second timeout for
    # one would only idle the gang (the fault benchmark's recreate mode waited 2 x 20 s).
    memory = stale_memory((120, 118), ago(61))
    reports = {0: report(0, 120), 1: report(1, 118, state="stopped")}
    found = decided(job(in_place=0), reports, memory=memory)
    assert found.status.phase == Phase.RESTARTING
    assert found.status.reason == Reason.HUNG
    assert (found.status.restarts, found.status.attempt) == (1, 1)
    assert "launchers do not restart it in place (spec.runtime.inPlaceRestarts is 0)" in (
        found.status.message
    )
    assert "stopped (SIGSTOP): rank 1" in found.status.message
    assert [e.reason for e in found.events][:1] == [Reason.HUNG]
    # With them, the same gang is only marked Hung: the launchers get their timeout first.
    waits = decided(job(), reports, memory=memory)
    assert waits.status.phase == Phase.RUNNING


def test_a_hang_past_max_restarts_fails_the_job() -> None:
    memory = stale_memory((120, 120), ago(200))
    hung_job = job(conditions=(hung_condition(ago(60)),), restarts=3)
    found = decided(hung_job, {0: report(0, 120), 1: report(1, 120)}, memory=memory)
    assert found.status.phase == Phase.FAILED
    assert found.status.reason == Reason.MAX_RESTARTS_EXCEEDED


def test_a_gang_not_all_running_is_not_judged_and_loses_its_hung_condition() -> None:
    memory = stale_memory((120, 120), ago(200))
    starting = job(conditions=(hung_condition(ago(60)),))
    pods = [make_pod(0), make_pod(1, phase="Pending")]
    found = decided(starting, {0: report(0, 120)}, memory=memory, pods=pods)
    assert found.status.phase == Phase.STARTING
    hung = found.status.condition(ConditionType.HUNG)
    assert hung is not None
    assert hung.status == "False"
    assert found.memory is None


def test_a_straggler_is_named_with_its_pod_and_node_once() -> None:
    pods = [make_pod(0, placed_node="node-a"), make_pod(1, placed_node="node-b")]
    slow_job = job(timeout=None, stragglers={"slowdown": 1.5, "reports": 2})
    memory = None
    events = []
    for n in range(4):
        reports = {0: report(0, 10 + n, time=n), 1: report(1, 10 + n, compute=0.2, time=n)}
        found = decided(slow_job, reports, memory=memory, pods=pods)
        memory, slow_job = found.memory, slow_job.model_copy(update={"status": found.status})
        events.extend(e for e in found.events if e.reason == Reason.STRAGGLER)
    straggler = slow_job.status.condition(ConditionType.STRAGGLER)
    assert straggler is not None
    assert straggler.status == "True"
    assert straggler.message == (
        f"rank 1 (pod {pods[1].name}, node node-b) is 2.0x the gang's median compute time per step"
    )
    assert len(events) == 1  # named once, not once per report


def test_goodput_is_written_only_when_what_it_counts_moves() -> None:
    first = decided(job(timeout=None), {0: report(0, 100), 1: report(1, 100)}, at=ago(10))
    goodput = first.status.goodput
    assert goodput is not None
    assert goodput.highest_step == 100
    assert goodput.productive_seconds == 50.0  # 100 steps x 0.5 s
    again = decide(
        resolve_job(job(timeout=None).model_copy(update={"status": first.status})),
        running(),
        NOW,
        reports={0: report(0, 100), 1: report(1, 100)},
        memory=first.memory,
    )
    assert again.status == first.status  # no status write at all


# --- reading the new keys of a /status document -------------------------------------------


def test_the_contracts_keys_are_read() -> None:
    found = read_report({
        "node_rank": 1,
        "ranks": {"3": {"step": 120, "time": 1764180000.12, "step_seconds": 0.41,
                        "compute_seconds": 0.18, "generation": 1, "state": "stopped"}},
        "restarts": {"count": 1, "causes": {"failure": 1, "hang": 0, "peer": 0},
                     "last": {"cause": "failure", "at": 1.0, "step_before": 120,
                              "resumed_from": 100, "first_step_at": 9.5}},
        "in_place": {"enabled": True, "max_restarts": 3, "hang_timeout_seconds": 60,
                     "reason": ""},
    })  # fmt: skip
    assert found is not None
    assert found.ranks == {3: RankReport(120, 1764180000.12, 0.41, 0.18, 1, "stopped")}
    assert found.restarts == RestartReport(
        1, {"failure": 1, "hang": 0, "peer": 0}, InPlaceRestart("failure", 1.0, 120, 100, 9.5)
    )
    assert found.in_place == InPlaceSetting(True, 3, 60.0, "")


def test_an_older_runtime_sends_none_of_them() -> None:
    found = read_report({"node_rank": 0, "progress": {"step": 1}})
    assert found is not None
    assert (found.ranks, found.restarts, found.in_place) == ({}, None, None)


@pytest.mark.parametrize(
    "ranks",
    [
        "not a mapping", ["3"], {"x": {}}, {"-1": {}}, {"²": {}}, {"3": "step 5"},
        {"99999999": {}},
    ],
    ids=["string", "list", "name", "negative", "superscript", "value", "huge"],
)  # fmt: skip
def test_ranks_that_are_not_ranks_are_dropped(ranks: Any) -> None:
    found = read_report({"node_rank": 0, "ranks": ranks})
    assert found is not None
    assert found.ranks == {}


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"step": "12"}, RankReport(None, None, None, None, None, "unknown")),
        ({"step": True, "generation": 1.5}, RankReport(None, None, None, None, None, "unknown")),
        ({"step": -1, "time": math.nan}, RankReport(None, None, None, None, None, "unknown")),
        ({"time": math.inf, "step_seconds": -0.1}, RankReport(None, None, None, None, None)),
        ({"compute_seconds": "fast", "state": "zombie"}, RankReport(None, None, None, None, None)),
        ({"step": 5, "state": 7}, RankReport(5, None, None, None, None, "unknown")),
    ],
    ids=["step-string", "bool-float", "negative-nan", "inf-negative", "words", "state-int"],
)
def test_malformed_values_are_ignored_never_raised(value: Any, expected: RankReport) -> None:
    found = read_report({"node_rank": 0, "ranks": {"0": value}})
    assert found is not None
    assert found.ranks == {0: expected}


@pytest.mark.parametrize(
    ("restarts", "in_place"),
    [
        ("1", "yes"),
        ({"count": "1"}, {"enabled": "true"}),
        ({"count": 2, "causes": "failure", "last": [1]}, {"enabled": True, "max_restarts": -1,
                                                         "reason": 5}),
        ({"count": 1, "causes": {"failure": "x", "meteor": 5},
          "last": {"cause": "meteor", "at": "noon"}}, None),
    ],
    ids=["strings", "string-fields", "wrong-shapes", "unknown-cause"],
)  # fmt: skip
def test_malformed_restarts_and_in_place_never_raise(restarts: Any, in_place: Any) -> None:
    found = read_report({"node_rank": 0, "restarts": restarts, "in_place": in_place})
    assert found is not None
    if found.restarts is not None:
        assert set(found.restarts.causes) <= {"failure", "hang", "peer"}
        last = found.restarts.last
        assert last is None or last.cause in {"failure", "hang", "peer", "unknown"}
    if found.in_place is not None:
        assert found.in_place.max_restarts is None
        assert found.in_place.reason == ""


def test_an_operator_that_has_not_read_the_workers_yet_changes_nothing() -> None:
    # After an operator restart the first reconcile may come before the first poll.
    hung_job = job(conditions=(hung_condition(ago(30)),))
    found = decide(resolve_job(hung_job), running(), NOW, reports={}, memory=None)
    hung = found.status.condition(ConditionType.HUNG)
    assert hung is not None
    assert hung.status == "True"
    assert found.events == ()


def test_unsetting_hang_timeout_seconds_clears_the_condition() -> None:
    memory = stale_memory((120, 120), ago(200))
    unset = job(timeout=None, conditions=(hung_condition(ago(30)),))
    found = decided(unset, {0: report(0, 120), 1: report(1, 120)}, memory=memory)
    hung = found.status.condition(ConditionType.HUNG)
    assert hung is not None
    assert (hung.status, hung.message) == ("False", "hangTimeoutSeconds is unset")


def test_an_in_place_restart_is_news_once() -> None:
    restarts = {"count": 1, "causes": {"failure": 1, "hang": 0, "peer": 0},
                "last": {"cause": "failure", "at": 5.0, "step_before": 120, "resumed_from": 100,
                         "first_step_at": 9.0}}  # fmt: skip
    reports = {}
    for rank in (0, 1):
        found = read_report({
            "node_rank": rank, "restarts": restarts,
            "ranks": {str(rank): {"step": 101, "time": 9.0, "step_seconds": 0.5}},
        })  # fmt: skip
        assert found is not None
        reports[rank] = found
    running_job = job(timeout=None)
    first = decided(running_job, reports)
    [news] = [e for e in first.events if e.reason == Reason.RESTARTED_IN_PLACE]
    assert news.type == "Warning"
    assert news.message == (
        "training processes restarted inside the running pods (cause failure): 1 of 3 "
        "in-place restarts of this gang used; 20 steps lost so far"
    )
    again = decided(
        running_job.model_copy(update={"status": first.status}), reports, memory=first.memory
    )
    assert not [e for e in again.events if e.reason == Reason.RESTARTED_IN_PLACE]


def replaced_condition(at: datetime) -> dict[str, Any]:
    return {"type": "WorkerReplacement", "status": "False", "reason": "WorkerReplaced",
            "message": "m", "lastTransitionTime": at.isoformat().replace("+00:00", "Z")}  # fmt: skip


def test_after_a_replacement_the_gang_is_judged_from_its_first_step() -> None:
    # The gang runs again 10 s after a worker was replaced alone; the kept workers' ranks
    # still show their last steps from before. Their agents restart (worker 0 replaced:
    # started again, waiting for cluster DNS to give the new pod's address) and may take
    # longer than the timeout: judged from their first step, as an in-place restart is.
    replaced = job(timeout=20, conditions=(replaced_condition(ago(10)),))
    first = decided(replaced, {1: report(1, 139)}, at=NOW, memory=None)
    assert first.memory is not None
    later = decided(replaced, {1: report(1, 139)}, at=NOW + timedelta(seconds=45),
                    memory=first.memory)  # fmt: skip
    assert later.status.condition(ConditionType.HUNG) is None
    assert later.status.phase == Phase.RUNNING
    stepped = decided(replaced, {0: report(0, 141), 1: report(1, 141)},
                      at=NOW + timedelta(seconds=50), memory=later.memory)  # fmt: skip
    stalled = decided(replaced, {0: report(0, 141), 1: report(1, 141)},
                      at=NOW + timedelta(seconds=75), memory=stepped.memory)  # fmt: skip
    hung = stalled.status.condition(ConditionType.HUNG)
    assert hung is not None
    assert hung.status == "True"  # from its first step on, the timeout holds again


def test_a_replacement_long_ago_does_not_shield_a_gang_first_seen_now() -> None:
    # An operator restarted: the memory is gone, the replacement ended 10 minutes before.
    replaced = job(timeout=20, conditions=(replaced_condition(ago(600)),))
    first = decided(replaced, {0: report(0, 139), 1: report(1, 139)}, memory=None)
    later = decided(replaced, {0: report(0, 139), 1: report(1, 139)},
                    at=NOW + timedelta(seconds=25), memory=first.memory)  # fmt: skip
    hung = later.status.condition(ConditionType.HUNG)
    assert hung is not None
    assert hung.status == "True"
