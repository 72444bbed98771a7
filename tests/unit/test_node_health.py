"""What the failure policy learns from the controller's caches: node readiness and when it
was lost, which nodes changed health, and worker pods kept after they left unfinished."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from factories import make_pod

from trainwave import contract
from trainwave.controller.clusterview import ClusterIndex
from trainwave.controller.departures import Departures
from trainwave.placement.records import node_record

pytestmark = pytest.mark.timeout(10)

SINCE = "2026-01-01T11:59:00Z"


def raw_node(name: str, ready: str | None = "True") -> dict[str, Any]:
    conditions = []
    if ready is not None:
        conditions = [{"type": "Ready", "status": ready, "lastTransitionTime": SINCE}]
    return {
        "metadata": {"name": name},
        "status": {"allocatable": {contract.GPU_RESOURCE: "8"}, "conditions": conditions},
    }


@pytest.mark.parametrize(
    ("ready", "expected"),
    [
        pytest.param("True", (True, None), id="ready"),
        pytest.param("False", (False, datetime(2026, 1, 1, 11, 59, tzinfo=UTC)), id="not-ready"),
        pytest.param("Unknown", (False, datetime(2026, 1, 1, 11, 59, tzinfo=UTC)), id="unknown"),
        pytest.param(None, (True, None), id="no-conditions-yet"),
    ],
)
def test_node_record_says_since_when_it_is_not_ready(
    ready: str | None, expected: tuple[bool, datetime | None]
) -> None:
    record = node_record(raw_node("n0", ready))
    assert (record.ready, record.not_ready_since) == expected


def test_index_reports_nodes_that_appeared_vanished_or_changed_readiness() -> None:
    index = ClusterIndex()
    index.replace_nodes({"n0": node_record(raw_node("n0")), "n1": node_record(raw_node("n1"))})
    assert index.drain_health_changes() == {"n0", "n1"}
    index.put_node("n0", node_record(raw_node("n0")))  # a heartbeat: nothing changed
    assert index.drain_health_changes() == set()
    index.put_node("n0", node_record(raw_node("n0", "Unknown")))
    index.put_node("n1", None)
    assert index.drain_health_changes() == {"n0", "n1"}
    index.replace_nodes({"n0": node_record(raw_node("n0", "Unknown"))})  # relist, same state
    assert index.drain_health_changes() == set()
    assert index.node("n1") is None


def test_departures_keep_pods_that_did_not_succeed_of_the_current_attempt_only() -> None:
    departures = Departures()
    key = ("ns", "demo")
    departures.record(key, make_pod(0, attempt=1))
    departures.record(key, make_pod(1, attempt=1, phase="Failed", exit_code=1))  # evidence
    departures.record(key, make_pod(2, attempt=1, phase="Succeeded", exit_code=0))  # no news
    departures.record(key, make_pod(0, attempt=0))
    kept = sorted(departures.of(key, 1), key=lambda p: p.rank)
    assert [(p.rank, p.deleting) for p in kept] == [(0, True), (1, True)], "read as deleting"
    assert kept[1].exit_code == 1, "the failed pod keeps its exit code"
    departures.keep_only(key, 2)
    assert (departures.of(key, 1), len(departures)) == ([], 0)
    departures.record(key, make_pod(0, attempt=2))
    departures.forget(key)
    assert len(departures) == 0
