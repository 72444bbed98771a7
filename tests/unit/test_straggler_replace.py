"""Replacing a straggler (runPolicy.stragglers.replace): the decision, the node's mark, and
placement keeping new gangs off a marked node until the mark expires."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from factories import NOW, ago, make_body, make_pod
from placement_factories import make_cluster, make_request

from trainwave import contract
from trainwave.api.reasons import Reason
from trainwave.api.status import ConditionType, Phase
from trainwave.api.trainingjob import parse_trainingjob
from trainwave.lifecycle.decide import Decision, decide
from trainwave.lifecycle.reports import WorkerReport, read_report
from trainwave.placement.gang import place
from trainwave.placement.gang_types import Placement, Unschedulable
from trainwave.placement.marks import close_marked, marks_of
from trainwave.placement.records import node_record
from trainwave.resolving import resolve_job

pytestmark = pytest.mark.timeout(20)


def report(node_rank: int, step: int, compute: float) -> WorkerReport:
    found = read_report({
        "node_rank": node_rank,
        "ranks": {str(node_rank): {"step": step, "time": float(step), "compute_seconds": compute,
                                   "step_seconds": 0.5, "generation": 0, "state": "running"}},
    })  # fmt: skip
    assert found is not None
    return found


def run(*, replace: bool = True, disruptions: int = 0, max_disruptions: int = 3) -> Decision:
    """Two 'reports' of a gang whose worker 1 computes 2x slower; the last decision."""
    body = make_body(
        phase="Running",
        start_time=ago(1000),
        failure_policy={"maxDisruptions": max_disruptions},
        status_extra={"disruptions": disruptions, "conditions": [
            {"type": "Running", "status": "True", "reason": "AllWorkersRunning"}]},
    )  # fmt: skip
    body["spec"]["runPolicy"]["stragglers"] = {"reports": 2, "replace": replace}
    job = parse_trainingjob(body)
    pods = [make_pod(0, placed_node="node-a"), make_pod(1, placed_node="node-b")]
    memory, found = None, None
    for step in (10, 11):
        reports = {0: report(0, step, 0.1), 1: report(1, step, 0.2)}
        found = decide(resolve_job(job), pods, NOW, reports=reports, memory=memory)
        memory = found.memory
        job = job.model_copy(update={"status": found.status})
    assert found is not None
    return found


def test_a_named_straggler_marks_its_node_and_recreates_the_gang_as_a_disruption() -> None:
    found = run()
    assert found.mark_nodes == ((("node-b", NOW + timedelta(seconds=3600))),)
    assert found.status.phase == Phase.RESTARTING
    assert found.status.reason == Reason.STRAGGLER_REPLACED
    assert (found.status.disruptions, found.status.restarts, found.status.attempt) == (1, 0, 1)
    assert len(found.delete_pods) == 2
    assert "node node-b is marked trainwave.io/straggler-until=2026-01-01T13:00:00Z" in (
        found.status.message
    )
    condition = found.status.condition(ConditionType.STRAGGLER)
    assert condition is not None
    assert (condition.status, condition.reason) == ("False", Reason.STRAGGLER_REPLACED)
    assert [e.reason for e in found.events] == [Reason.STRAGGLER, Reason.STRAGGLER_REPLACED]


@pytest.mark.parametrize(
    "options",
    [{"replace": False}, {"disruptions": 3, "max_disruptions": 3}],
    ids=["replace-off", "disruptions-spent"],
)
def test_otherwise_the_straggler_is_only_named(options: dict[str, Any]) -> None:
    found = run(**options)
    assert found.mark_nodes == ()
    assert found.status.phase == Phase.RUNNING
    assert not found.delete_pods
    condition = found.status.condition(ConditionType.STRAGGLER)
    assert condition is not None
    assert condition.status == "True"


def node_body(name: str, until: Any) -> dict[str, Any]:
    annotations = {} if until is None else {contract.ANNOTATION_STRAGGLER_UNTIL: until}
    return {"metadata": {"name": name, "annotations": annotations},
            "status": {"allocatable": {"nvidia.com/gpu": "8"}}}  # fmt: skip


@pytest.mark.parametrize(
    ("until", "expected"),
    [
        ("2026-01-01T13:00:00Z", NOW + timedelta(hours=1)),
        ("2026-01-01T13:00:00", None),  # no zone: not a time the operator wrote
        ("soon", None),
        (17, None),
        (None, None),
    ],
    ids=["rfc3339", "naive", "word", "number", "absent"],
)
def test_the_mark_is_read_from_the_nodes_annotation(until: Any, expected: Any) -> None:
    assert node_record(node_body("n", until)).straggler_until == expected


def test_a_marked_node_is_closed_to_gangs_until_the_mark_expires() -> None:
    cluster = make_cluster([8, 8])  # r0-n0, r0-n1
    request = make_request(2, 8)
    marks = {"r0-n1": NOW + timedelta(minutes=5)}
    closed = close_marked(cluster, marks, NOW)
    refused = place(closed, request)
    assert isinstance(refused, Unschedulable)
    assert isinstance(place(make_cluster([8, 8, 8]), request), Placement)
    node = closed.nodes[1]
    assert not node.schedulable
    assert node.closed_why == (
        "a straggler ran here (trainwave.io/straggler-until=2026-01-01T12:05:00Z)"
    )
    assert close_marked(cluster, marks, NOW + timedelta(minutes=5)) is cluster  # expired
    assert close_marked(cluster, {}, NOW) is cluster


def test_marks_come_from_every_node_record_that_has_one() -> None:
    records = [
        node_record(node_body("a", "2026-01-01T13:00:00Z")),
        node_record(node_body("b", None)),
    ]
    assert marks_of(records) == {"a": NOW + timedelta(hours=1)}
