"""Rule 9 of the queue: a gang with a run bound may start on room held for a protected gang
when it is gone before that gang could start anyway (EASY backfill)."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from placement_factories import make_cluster, make_request

from trainwave.contract import GPU_RESOURCE, NODE_LABEL_RACK
from trainwave.placement.backfill import BoundedGang, RunBounds
from trainwave.placement.gang_types import Blocker
from trainwave.placement.queueing import (
    DEFAULT_BACKFILL_MARGIN,
    HELD_FOR_EARLIER_JOB,
    Admit,
    PendingJob,
    QueuePolicy,
    Schedule,
    schedule,
)
from trainwave.placement.requirements import PodNeeds

pytestmark = pytest.mark.timeout(10)

NOW = 1_000.0
WHOLE_NODE = PodNeeds(requests=((GPU_RESOURCE, 8),))
MARGIN = DEFAULT_BACKFILL_MARGIN


def job(
    key: str,
    workers: int,
    *,
    arrival: float,
    skipped: int = 0,
    max_run: float | None = None,
    **request: object,
) -> PendingJob:
    return PendingJob(
        key,
        make_request(workers, name=key, **request),  # type: ignore[arg-type]
        arrival=arrival,
        skipped=skipped,
        max_run=max_run,
    )


def running(node: str, end: float) -> BoundedGang:
    return BoundedGang(end, WHOLE_NODE, ((node, 1),))


def outcome(result: Schedule) -> dict[str, str]:
    return {
        d.job.key: ("held-room" if d.on_held_room else "admit") if isinstance(d, Admit) else d.code
        for d in result.decisions
    }


def two_free_two_busy(*gangs: BoundedGang, small_run: float | None, big: int = 4) -> Schedule:
    """One rack of four whole nodes: r0-n0 and r0-n1 free, r0-n2 and r0-n3 busy; `big`
    (protected: it was overtaken 4 times) waits for `big` of them, a one-node gang follows."""
    cluster = make_cluster([8, 8, 0, 0])
    pending = [
        job("big", big, arrival=1, skipped=4),
        job("small", 1, arrival=2, max_run=small_run),
    ]
    return schedule(cluster, pending, QueuePolicy(max_skips=4), bounds=RunBounds(NOW, gangs))


BUSY = (running("r0-n2", NOW + 100), running("r0-n3", NOW + 200))


def test_a_gang_that_ends_before_the_protected_gang_could_start_takes_its_held_room() -> None:
    result = two_free_two_busy(*BUSY, small_run=50)
    assert outcome(result) == {"big": Blocker.NOT_ENOUGH_GPUS, "small": "held-room"}
    [admit] = result.admitted
    assert admit.placement.nodes[0] in {"r0-n0", "r0-n1"}
    big = next(w for w in result.waiting if w.job.key == "big")
    assert big.skipped == 4  # it cannot be delayed, so nothing is counted against it


@pytest.mark.parametrize(
    ("small_run", "expected"),
    [
        pytest.param(None, HELD_FOR_EARLIER_JOB, id="no-bound"),
        pytest.param(200 - MARGIN, "held-room", id="ends-exactly-at-the-shadow"),
        pytest.param(200 - MARGIN + 1, HELD_FOR_EARLIER_JOB, id="one-second-too-long"),
    ],
)
def test_the_bound_plus_margin_must_not_pass_the_shadow_time(
    small_run: float | None, expected: str
) -> None:
    assert outcome(two_free_two_busy(*BUSY, small_run=small_run))["small"] == expected


def test_an_unbounded_gang_on_the_held_room_means_no_shadow_time() -> None:
    result = two_free_two_busy(running("r0-n2", NOW + 100), small_run=10)  # r0-n3: no bound
    assert outcome(result)["small"] == HELD_FOR_EARLIER_JOB


def test_the_shadow_is_the_first_moment_enough_room_is_free() -> None:
    # Three nodes do for `big`: r0-n2 ends at +100, which completes its room.
    assert outcome(two_free_two_busy(*BUSY, small_run=90, big=3))["small"] == "held-room"
    assert outcome(two_free_two_busy(*BUSY, small_run=96, big=3))["small"] == (HELD_FOR_EARLIER_JOB)


def test_without_bounds_the_queue_holds_as_before() -> None:
    cluster = make_cluster([8, 8, 0, 0])
    pending = [job("big", 4, arrival=1, skipped=4), job("small", 1, arrival=2, max_run=10)]
    result = schedule(cluster, pending, QueuePolicy(max_skips=4))
    assert outcome(result)["small"] == HELD_FOR_EARLIER_JOB


def test_gangs_started_on_held_room_count_in_the_next_ones_shadow() -> None:
    """Two one-node gangs fill the two free nodes; each ends before `big` could start."""
    cluster = make_cluster([8, 8, 0, 0])
    pending = [
        job("big", 4, arrival=1, skipped=4),
        job("a", 1, arrival=2, max_run=50),
        job("b", 1, arrival=3, max_run=190),
        job("c", 1, arrival=4, max_run=10),
    ]
    result = schedule(cluster, pending, QueuePolicy(max_skips=4), bounds=RunBounds(NOW, BUSY))
    got = outcome(result)
    assert got["a"] == got["b"] == "held-room"
    assert got["c"] != "held-room"  # no room left at all


@pytest.mark.parametrize("seed", range(20))
def test_shadow_times_agree_with_a_linear_scan(seed: int) -> None:
    """Random ends on busy nodes; `big` needs the free nodes plus k busy ones, so its
    shadow is the k-th earliest end; a bound that ends exactly then is let in, one second
    more is not."""
    rng = random.Random(seed)
    nodes = rng.randint(3, 12)
    free = rng.randint(1, nodes - 1)
    busy = [f"r0-n{i}" for i in range(free, nodes)]
    ends = [NOW + rng.randint(1, 500) for _ in busy]
    k = rng.randint(1, len(busy))
    shadow = sorted(ends)[k - 1]
    cluster = make_cluster([8] * free + [0] * len(busy))
    bounds = RunBounds(NOW, tuple(running(n, e) for n, e in zip(busy, ends, strict=True)))

    def small_with(run: float) -> str:
        pending = [
            job("big", free + k, arrival=1, skipped=4),
            job("small", 1, arrival=2, max_run=run),
        ]
        return outcome(schedule(cluster, pending, QueuePolicy(max_skips=4), bounds=bounds))["small"]

    fits = shadow - NOW - MARGIN
    if fits > 0:
        assert small_with(fits) == "held-room"
    assert small_with(fits + 1) == HELD_FOR_EARLIER_JOB


def test_a_bounded_gang_that_fits_outside_the_held_room_starts_there() -> None:
    cluster = make_cluster([8, 8, 0, 0], [8, 0, 0, 0])
    pending = [
        job("big", 4, arrival=1, skipped=4, node_selector={NODE_LABEL_RACK: "rack-0"}),
        job("small", 1, arrival=2, max_run=10),
    ]
    result = schedule(cluster, pending, QueuePolicy(max_skips=4), bounds=RunBounds(NOW, BUSY))
    [admit] = result.admitted
    assert not admit.on_held_room
    assert tuple(admit.placement.nodes) == ("r1-n0",)


def test_replace_keeps_the_bound() -> None:
    pending = job("a", 1, arrival=0, max_run=5)
    assert replace(pending, skipped=2).max_run == 5


def test_starts_on_held_room_count_no_skip_against_gangs_held_back_behind_it() -> None:
    """`long` (bound too long) waits behind `big`'s hold; the short gangs that start on the
    held room are gone before `big`, so before `long` too: they do not overtake it, and it
    does not become protected and close the room to the short gangs after it."""
    cluster = make_cluster([8, 8, 8, 8, 8, 0, 0, 0])
    busy = tuple(running(f"r0-n{i}", NOW + 100 * i) for i in (5, 6, 7))
    pending = [
        job("big", 8, arrival=0, skipped=4),
        job("long", 1, arrival=1, max_run=10_000),
        *(job(f"short-{i}", 1, arrival=2 + i, max_run=50) for i in range(5)),
    ]
    result = schedule(cluster, pending, QueuePolicy(max_skips=4), bounds=RunBounds(NOW, busy))
    got = outcome(result)
    assert [got[f"short-{i}"] for i in range(5)] == ["held-room"] * 5
    assert got["long"] == HELD_FOR_EARLIER_JOB
    assert next(w for w in result.waiting if w.job.key == "long").skipped == 0


def test_a_bounded_gang_held_back_is_told_why_its_bound_did_not_help() -> None:
    too_long = two_free_two_busy(*BUSY, small_run=300)
    held = next(w for w in too_long.waiting if w.job.key == "small")
    assert held.reason == (
        "waiting for big, which later jobs have overtaken 4 times: until it starts, nothing "
        "else may start on the 4 nodes it can use; its runPolicy.maxRunSeconds (300s) would "
        "not end before that room is complete"
    )
    unknown = two_free_two_busy(running("r0-n2", NOW + 100), small_run=10)
    held = next(w for w in unknown.waiting if w.job.key == "small")
    assert held.reason.endswith(
        "; its runPolicy.maxRunSeconds cannot help: that room is complete only once gangs "
        "that state none have ended"
    )


def test_a_gang_without_a_bound_is_told_when_one_would_help() -> None:
    unbounded = two_free_two_busy(*BUSY, small_run=None)
    held = next(w for w in unbounded.waiting if w.job.key == "small")
    assert held.reason.endswith(
        "nothing else may start on the 4 nodes it can use; a job that states "
        "runPolicy.maxRunSeconds may start on that room when it would end before the room "
        "is complete"
    )
    # The held room waits on a gang without a bound too: no bound could help, so no hint.
    no_shadow = two_free_two_busy(running("r0-n2", NOW + 100), small_run=None)
    held = next(w for w in no_shadow.waiting if w.job.key == "small")
    assert held.reason.endswith("nothing else may start on the 4 nodes it can use")
