"""Priority preemption of whole gangs (placement/preemption.py through the pure round)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from placement_factories import make_cluster, make_request

from trainwave.placement.preemption import RunningGang
from trainwave.placement.queueing import PendingJob
from trainwave.placement.requirements import PodNeeds
from trainwave.placement.round import Ticket, plan_round

pytestmark = pytest.mark.timeout(10)

NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
EIGHT = PodNeeds(requests=(("nvidia.com/gpu", 8),))


def gang(key: str, nodes: dict[str, int], priority: int = 0, **fields: object) -> RunningGang:
    return RunningGang(key, priority, needs=EIGHT, workers_by_node=tuple(nodes.items()),
                       **{"preemptible": True, **fields})  # type: ignore[arg-type]  # fmt: skip


def full_cluster() -> tuple[object, list[RunningGang]]:
    """2 racks x 2 nodes x 8 GPUs, every node held by a 1-worker gang of its own, except
    rack 1, which one 2-worker gang holds."""
    snapshot = make_cluster([0, 0], [0, 0])
    running = [
        gang("ns/a", {"r0-n0": 1}, priority=1),
        gang("ns/b", {"r0-n1": 1}, priority=1),
        gang("ns/big", {"r1-n0": 1, "r1-n1": 1}, priority=0),
    ]
    return snapshot, running


def ticket(workers: int, priority: int) -> Ticket:
    return Ticket(PendingJob("ns/urgent", make_request(workers, 8), priority=priority))


def test_the_smallest_set_of_whole_gangs_in_one_rack_is_preempted() -> None:
    snapshot, running = full_cluster()
    result = plan_round(snapshot, [ticket(2, 10)], NOW, running=running)  # type: ignore[arg-type]
    [preemption] = result.preemptions
    assert preemption.victims == ("ns/big",), "one gang frees a whole rack; a and b are two"
    assert set(preemption.placement.nodes) == {"r1-n0", "r1-n1"}


def test_non_preemptible_equal_priority_and_recently_preempted_gangs_are_never_victims() -> None:
    snapshot, _running = full_cluster()
    protected = [
        gang("ns/a", {"r0-n0": 1}, priority=10),
        gang("ns/b", {"r0-n1": 1}, preemptible=False),
        gang("ns/big", {"r1-n0": 1, "r1-n1": 1}, preempted_at=NOW - timedelta(minutes=1)),
    ]
    result = plan_round(snapshot, [ticket(1, 10)], NOW, running=protected)  # type: ignore[arg-type]
    assert result.preemptions == ()
    later = plan_round(snapshot, [ticket(1, 10)], NOW + timedelta(minutes=10), running=protected)  # type: ignore[arg-type]
    assert [p.victims for p in later.preemptions] == [("ns/big",)], "after the grace period"


def test_no_preemption_when_the_gang_fits_or_would_not_fit_anyway() -> None:
    snapshot, running = full_cluster()
    assert plan_round(snapshot, [ticket(5, 10)], NOW, running=running).preemptions == ()  # type: ignore[arg-type]
    empty = make_cluster([8, 8], [8, 8])
    result = plan_round(empty, [ticket(2, 10)], NOW, running=running)
    assert result.admitted
    assert result.preemptions == ()


def test_a_gang_waiting_only_for_one_rack_preempts_nobody() -> None:
    """It fits now, spread over racks (rule 8 of queueing.py): waiting is its own choice."""
    snapshot = make_cluster([8, 0], [8, 0])
    running = [gang("ns/a", {"r0-n1": 1}), gang("ns/b", {"r1-n1": 1})]
    patient = PendingJob(
        "ns/urgent", make_request(2, 8, preferred_level="rack"), priority=10, may_spread=False
    )
    result = plan_round(snapshot, [Ticket(patient)], NOW, running=running)  # type: ignore[arg-type]
    assert [w.code for w in result.waiting] == ["WaitingForPreferredLevel"]
    assert result.preemptions == ()
