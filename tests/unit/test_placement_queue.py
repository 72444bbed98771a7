"""The queue: priority then FIFO, whole gangs only, and backfill that cannot starve a gang."""

from __future__ import annotations

from dataclasses import replace

import pytest
from placement_factories import make_cluster, make_node, make_request

from trainwave.contract import NODE_LABEL_GPU_PRODUCT, NODE_LABEL_RACK
from trainwave.placement.gang_types import Blocker
from trainwave.placement.queueing import (
    HELD_FOR_EARLIER_JOB,
    NEVER_FITS,
    Admit,
    PendingJob,
    QueuePolicy,
    Schedule,
    Wait,
    schedule,
)
from trainwave.placement.snapshot import ClusterSnapshot

pytestmark = pytest.mark.timeout(10)

FULL = [8, 8, 8, 8]
EMPTY = [0, 0, 0, 0]


def job(
    key: str, workers: int, *, arrival: float = 0, priority: int = 0, skipped: int = 0, **kw: object
) -> PendingJob:
    request = make_request(workers, name=key, **kw)  # type: ignore[arg-type]
    return PendingJob(key, request, priority=priority, arrival=arrival, skipped=skipped)


def outcome(result: Schedule) -> dict[str, str]:
    """key -> 'admit', 'backfill' or the Wait code."""
    return {
        d.job.key: ("backfill" if d.backfilled else "admit") if isinstance(d, Admit) else d.code
        for d in result.decisions
    }


def wait_of(result: Schedule, key: str) -> Wait:
    return next(w for w in result.waiting if w.job.key == key)


@pytest.mark.parametrize(
    ("first", "second"),
    [pytest.param("a", "b", id="a-first"), pytest.param("b", "a", id="b-first")],
)
def test_two_gangs_that_fit_only_alone_never_hold_half_each(first: str, second: str) -> None:
    arrivals = {first: 1, second: 2}
    pending = [job(key, 6, arrival=arrivals[key]) for key in ("a", "b")]
    result = schedule(make_cluster(FULL, FULL), pending)
    assert outcome(result) == {first: "admit", second: Blocker.NOT_ENOUGH_GPUS}
    assert len(result.admitted[0].placement.nodes) == 6
    assert wait_of(result, second).reason == (
        "needs 48 GPUs (6 workers x 8); the free GPUs have room for 2 such workers (16 GPUs free); "
        "2/8 nodes fit a worker: 6 too few free nvidia.com/gpu (needs 8, largest free 0)"
    )
    assert sum(result.snapshot.free) == 16


def test_priority_then_arrival_then_key() -> None:
    pending = [
        job("low-early", 6, arrival=1),
        job("high-late", 4, arrival=3, priority=5),
        job("high-early", 4, arrival=2, priority=5),
    ]
    result = schedule(make_cluster(FULL, FULL), pending)
    assert [d.job.key for d in result.decisions] == ["high-early", "high-late", "low-early"]
    assert outcome(result) == {
        "high-early": "admit", "high-late": "admit", "low-early": Blocker.NOT_ENOUGH_GPUS
    }  # fmt: skip


# (skips the big job already has, max_skips, expected outcome of the small one, big's skips after)
BACKFILL = [
    pytest.param(0, 4, "backfill", 1, id="backfill-counts-a-skip"),
    pytest.param(3, 4, "backfill", 4, id="last-allowed-skip"),
    pytest.param(4, 4, HELD_FOR_EARLIER_JOB, 4, id="bound-reached-holds"),
    pytest.param(0, 0, HELD_FOR_EARLIER_JOB, 0, id="strict-fifo"),
]


@pytest.mark.parametrize(("skipped", "limit", "small", "after"), BACKFILL)
def test_backfill_is_bounded(skipped: int, limit: int, small: str, after: int) -> None:
    pending = [job("big", 6, arrival=1, skipped=skipped), job("small", 2, arrival=2)]
    result = schedule(make_cluster(FULL, EMPTY), pending, QueuePolicy(max_skips=limit))
    assert outcome(result) == {"big": Blocker.NOT_ENOUGH_GPUS, "small": small}
    assert wait_of(result, "big").skipped == after


def test_held_job_is_told_who_it_waits_for() -> None:
    pending = [job("team/big", 6, arrival=1, skipped=2), job("small", 2, arrival=2)]
    result = schedule(make_cluster(FULL, EMPTY), pending, QueuePolicy(max_skips=2))
    assert wait_of(result, "small").reason == (
        "waiting for team/big, which later jobs have overtaken 2 times: until it starts, "
        "nothing else may start on the 8 nodes it can use"
    )


def mixed_fleet() -> ClusterSnapshot:
    """Four H100 nodes (two busy) and two A100 nodes."""
    nodes = [
        make_node(f"h{i}", rack="rack-0", free=8 if i < 2 else 0,
                  labels={NODE_LABEL_GPU_PRODUCT: "H100"})
        for i in range(4)
    ] + [make_node(f"a{i}", rack="rack-1", labels={NODE_LABEL_GPU_PRODUCT: "A100"})
         for i in range(2)]  # fmt: skip
    return ClusterSnapshot.of(nodes)


H100_ONLY = {NODE_LABEL_GPU_PRODUCT: "H100"}


def test_protected_job_still_lets_others_use_nodes_it_cannot_use() -> None:
    pending = [
        job("big", 3, arrival=1, skipped=4, node_selector=H100_ONLY),
        job("any", 2, arrival=2),
        job("h100", 1, arrival=3, node_selector=H100_ONLY),
    ]
    result = schedule(mixed_fleet(), pending)
    assert outcome(result) == {
        "big": Blocker.NOT_ENOUGH_GPUS, "any": "backfill", "h100": HELD_FOR_EARLIER_JOB
    }  # fmt: skip
    assert set(result.admitted[0].placement.nodes) == {"a0", "a1"}


def test_backfill_on_nodes_the_waiting_job_cannot_use_is_no_skip() -> None:
    pending = [
        job("big", 3, arrival=1, node_selector=H100_ONLY),
        job("a100", 2, arrival=2, node_selector={NODE_LABEL_GPU_PRODUCT: "A100"}),
    ]
    result = schedule(mixed_fleet(), pending)
    assert outcome(result)["a100"] == "backfill"
    assert wait_of(result, "big").skipped == 0


def test_a_job_that_never_fits_blocks_nobody() -> None:
    pending = [job("huge", 100, arrival=1), job("small", 2, arrival=2)]
    result = schedule(make_cluster(FULL, FULL), pending, QueuePolicy(max_skips=0))
    assert outcome(result) == {"huge": NEVER_FITS, "small": "admit"}
    assert wait_of(result, "huge").reason == (
        "cannot fit even on an empty cluster: needs 800 GPUs (100 workers x 8); "
        "the free GPUs have room for 8 such workers (64 GPUs free)"
    )


def test_invalid_request_keeps_its_own_reason() -> None:
    result = schedule(make_cluster(FULL), [job("bad", 3, tensor=3)])
    assert outcome(result) == {"bad": Blocker.INVALID_REQUEST}


def run_rounds(limit: int, rounds: int = 30) -> tuple[int | None, int]:
    """Eight nodes busy with one-node jobs; two new one-node jobs (4 rounds long) arrive every
    round; a whole-cluster gang waits. Returns (round the gang started, its most skips)."""
    snapshot = make_cluster(FULL, FULL)
    running: list[tuple[int, dict[str, int]]] = []
    for end, name in enumerate(snapshot.topology.node_names, start=1):
        running.append((end, {name: 8}))
        snapshot = snapshot.with_usage({name: 8})
    pending = [job("big", 8)]
    most = 0
    for now in range(rounds):
        for _, usage in (r for r in running if r[0] == now):
            snapshot = snapshot.with_usage({node: -gpus for node, gpus in usage.items()})
        running = [r for r in running if r[0] != now]
        pending += [job(f"small-{now}-{i}", 1, arrival=now + i / 10 + 1) for i in range(2)]
        result = schedule(snapshot, pending, QueuePolicy(max_skips=limit))
        snapshot = result.snapshot
        for admit in result.admitted:
            if admit.job.key == "big":
                return now, most
            running.append((now + 4, admit.placement.gpus_by_node()))
        pending = [replace(wait.job, skipped=wait.skipped) for wait in result.waiting]
        most = max(most, wait_of(result, "big").skipped)
    return None, most


def test_a_stream_of_small_jobs_cannot_starve_a_gang() -> None:
    started, most = run_rounds(limit=3)
    assert most == 3
    assert started is not None
    assert started <= 8  # the last node held for it frees in round 8


def test_without_the_bound_the_gang_starves() -> None:
    started, most = run_rounds(limit=1000)
    assert started is None
    assert most > 20


def test_a_gang_waits_rather_than_spread_when_its_one_rack_room_is_held() -> None:
    # rack-0 has room for the small gang but is held for `big` (protected at once with
    # max_skips=0); outside it, the small gang could only start split over two racks.
    cluster = make_cluster([4, 8, 8, 8], [4, 0, 0, 0], [4, 0, 0, 0])
    big = job("big", 4, gpus=8, node_selector={NODE_LABEL_RACK: "rack-0"}, arrival=0)
    small = job("small", 2, gpus=4, preferred_level="rack", arrival=1)
    result = schedule(cluster, [big, small], QueuePolicy(max_skips=0))
    assert not result.admitted
    assert [w.code for w in result.waiting] == [Blocker.NOT_ENOUGH_GPUS, HELD_FOR_EARLIER_JOB]
    # Without the hold it starts inside rack-0.
    alone = schedule(cluster, [small], QueuePolicy(max_skips=0))
    assert alone.admitted[0].placement.preferred_met


def test_a_gang_not_yet_allowed_to_spread_waits_for_one_rack_and_blocks_nobody() -> None:
    """Rule 8: spreading waits while the caller's wait runs; smaller gangs still start."""
    snapshot = make_cluster([8, 8, 0, 0], [8, 8, 8, 0])  # 2 and 3 nodes free
    big = replace(job("big", 4, preferred_level="rack", arrival=1), may_spread=False)
    small = job("small", 1, preferred_level="rack", arrival=2)
    result = schedule(snapshot, [big, small])
    assert outcome(result) == {"big": "WaitingForPreferredLevel", "small": "admit"}
    assert wait_of(result, "big").reason == (
        "no rack has room for 4 workers (roomiest: rack-1, 3), though one could hold the gang: "
        "waiting for one (up to spec.placement.preferredLevelWaitSeconds) before starting "
        "spread out"
    )
    assert wait_of(result, "big").skipped == 0  # not blocked: it counts no skips
    allowed = schedule(snapshot, [replace(big, may_spread=True)])
    assert allowed.admitted[0].placement.preferred_met is False


@pytest.mark.parametrize(
    ("workers", "racks"),
    [
        pytest.param(3, [[8, 8, 8, 0], [8, 8, 8, 8]], id="one-rack-has-room"),
        pytest.param(6, [[8, 8, 8, 8], [8, 8, 0, 0]], id="no-rack-could-ever-hold-it"),
    ],
)
def test_rule_8_never_delays_a_gang_that_waiting_cannot_help(
    workers: int, racks: list[list[int]]
) -> None:
    gang = replace(job("g", workers, preferred_level="rack"), may_spread=False)
    assert outcome(schedule(make_cluster(*racks), [gang])) == {"g": "admit"}


def test_rule_8b_a_gang_with_gangs_waiting_behind_it_spreads_at_once() -> None:
    """In a saturated cluster the wait for one rack would idle the room the queue waits for."""
    snapshot = make_cluster([8, 8, 0, 0], [8, 8, 8, 0])  # 2 and 3 nodes free
    first = replace(job("first", 4, preferred_level="rack", arrival=1), may_spread=False)
    second = replace(job("second", 4, preferred_level="rack", arrival=2), may_spread=False)
    result = schedule(snapshot, [first, second])
    assert outcome(result) == {"first": "admit", "second": Blocker.NOT_ENOUGH_GPUS}
    assert result.admitted[0].placement.preferred_met is False
    # Both asked once per snapshot for their shared shape: each answer carries its own name.
    assert result.admitted[0].placement.job == "first"
    # Alone, with nobody behind it, the same gang waits for one rack (rule 8).
    assert outcome(schedule(snapshot, [first])) == {"first": "WaitingForPreferredLevel"}


def test_rule_8b_a_gang_that_never_fits_behind_it_does_not_count_as_waiting() -> None:
    snapshot = make_cluster([8, 8, 0, 0], [8, 8, 8, 0])
    first = replace(job("first", 4, preferred_level="rack", arrival=1), may_spread=False)
    huge = job("huge", 40, arrival=2)
    result = schedule(snapshot, [first, huge])
    assert outcome(result) == {"first": "WaitingForPreferredLevel", "huge": NEVER_FITS}


def test_rule_8b_the_last_of_several_rack_waiters_keeps_its_wait_while_room_lasts() -> None:
    """Only gangs with someone waiting behind them are waived; the round is decided again."""
    snapshot = make_cluster([8, 8, 0, 0], [8, 8, 8, 0], [8, 8, 8, 0])  # 2, 3 and 3 free
    gangs = [
        replace(job(key, 4, preferred_level="rack", arrival=i), may_spread=False)
        for i, key in enumerate(("a", "b"))
    ]
    result = schedule(snapshot, gangs)
    # a spreads (b waits behind it); b then finds 4 of the 8 free nodes, but none in one
    # rack, and nobody waits behind it: it keeps its wait for one rack.
    assert outcome(result) == {"a": "admit", "b": "WaitingForPreferredLevel"}


def test_rule_8a_a_protected_gang_starts_spread_once_its_room_is_complete() -> None:
    snapshot = make_cluster([8, 8, 0, 0], [8, 8, 8, 0])
    protected = replace(
        job("big", 4, preferred_level="rack", arrival=1, skipped=4), may_spread=False
    )
    result = schedule(snapshot, [protected], QueuePolicy(max_skips=4))
    assert outcome(result) == {"big": "admit"}
    assert result.admitted[0].placement.preferred_met is False
    not_yet = replace(protected, skipped=3)
    assert outcome(schedule(snapshot, [not_yet], QueuePolicy(max_skips=4))) == {
        "big": "WaitingForPreferredLevel"
    }


def test_the_operator_flag_sets_the_backfill_bound(capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from trainwave.cli.operator import add_operator_parser

    parser = argparse.ArgumentParser()
    add_operator_parser(parser.add_subparsers(dest="command"))
    assert parser.parse_args(["operator"]).queue_max_skips == QueuePolicy().max_skips
    assert parser.parse_args(["operator", "--queue-max-skips", "0"]).queue_max_skips == 0
    for bad in ("-1", "two", "1.5"):
        with pytest.raises(SystemExit):
            parser.parse_args(["operator", "--queue-max-skips", bad])
        assert f"{bad!r}: expected a whole number, 0 or more" in capsys.readouterr().err
