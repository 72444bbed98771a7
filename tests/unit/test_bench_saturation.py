"""The pure parts of tests/benchmarks/bench_saturation.py: the seeded stream and what the
analysis makes of pod spans (room, hand-off lag, holds, utilisation bounds, makespan). The
cluster run itself is the benchmark (make bench-saturation)."""

from __future__ import annotations

import pytest

from benchmarks.saturation_analysis import (
    GangSpan,
    PodSpan,
    greedy_makespan,
    holds_between,
    makespan,
    room_appeared,
    subset_sum,
    summarize_gangs,
    utilisation,
    waits_by_size,
)
from benchmarks.saturation_stream import CONFIGS, make_stream, training_job
from trainwave import contract

pytestmark = pytest.mark.timeout(10)


def pod(gang: str, node: str, start: float, end: float | None, gpus: int = 8) -> PodSpan:
    """Released and bound 0.1 s before Running, as a hand-off goes."""
    return PodSpan(gang, node, gpus, start - 0.2, start - 0.1, start, end)


def gang(name: str, arrival: float, *pods: PodSpan, run: float = 10.0) -> GangSpan:
    gpus = sum(p.gpus for p in pods)
    return GangSpan(name, len(pods), gpus, arrival, run, pods)


def test_stream_is_seeded_and_deeper_than_the_cluster() -> None:
    config = CONFIGS["small"]
    first, again = make_stream(config), make_stream(config)
    assert first == again
    burst = [job for job in first if job.arrival == 0.0]
    assert len(burst) == config.burst
    assert sum(job.workers for job in burst) > config.nodes
    assert [j.arrival for j in first] == sorted(j.arrival for j in first)


def test_training_job_finishes_after_its_run_time() -> None:
    job = make_stream(CONFIGS["small"])[0]
    body = training_job(job, "ns")
    annotations = body["spec"]["template"]["metadata"]["annotations"]
    assert annotations[contract.SIM_RUN_FOR] == f"{job.run_seconds}s"
    assert body["spec"]["workers"] == job.workers


@pytest.mark.parametrize(
    ("others", "need", "expected"),
    [
        pytest.param([], 8, float("-inf"), id="empty-node"),
        pytest.param([("a", 1.0, 10.0, 8)], 8, 10.0, id="whole-node-freed"),
        pytest.param([("a", 1.0, 10.0, 4), ("b", 1.0, 12.0, 4)], 8, 12.0, id="last-of-two"),
        pytest.param([("a", 1.0, 10.0, 4), ("b", 1.0, 12.0, 4)], 4, 10.0, id="first-of-two"),
        pytest.param([("a", 1.0, 10.0, 4)], 4, float("-inf"), id="room-beside-it"),
    ],
)
def test_room_appears_when_enough_gpus_are_free(
    others: list[tuple[str, float, float, int]], need: int, expected: float
) -> None:
    spans = [pod(name, "n1", start, end, gpus) for name, start, end, gpus in others]
    waiting = gang("g", 0.0, pod("g", "n1", 20.0, None, need))
    assert room_appeared(waiting, {"n1": [*spans, *waiting.pods]}, 8) == expected


def test_room_of_a_gang_is_its_last_node_freed() -> None:
    first = gang("a", 0.0, pod("a", "n1", 1.0, 10.0), pod("a", "n2", 1.0, 14.0))
    second = gang("b", 2.0, pod("b", "n1", 15.0, None), pod("b", "n2", 15.5, None))
    summary = summarize_gangs([first, second], 8)
    assert summary["handoff_lag_seconds"]["p50"] == 1.5  # 15.5 - 14.0
    assert summary["found_room_at_once_start_seconds"]["count"] == 1  # gang a


def test_a_hand_off_held_by_policy_counts_apart() -> None:
    first = gang("a", 0.0, pod("a", "n1", 1.0, 10.0))
    second = gang("b", 2.0, pod("b", "n1", 16.0, None))
    held = {"b": [(3.0, "NotEnoughResources"), (11.0, "HeldForEarlierJob"), (15.5, "Placing")]}
    summary = summarize_gangs([first, second], 8, held)
    assert summary["handoff_lag_not_held_seconds"] == {"count": 0}
    assert summary["handoff_lag_held_by_policy_seconds"]["HeldForEarlierJob"]["p50"] == 6.0


@pytest.mark.parametrize(
    ("changes", "since", "until", "expected"),
    [
        pytest.param([(1.0, "HeldForEarlierJob")], 5.0, 9.0, {"HeldForEarlierJob"}, id="before"),
        pytest.param([(1.0, "HeldForEarlierJob"), (4.0, "Placing")], 5.0, 9.0, set(), id="ended"),
        pytest.param(
            [(6.0, "WaitingForPreferredLevel")], 5.0, 9.0, {"WaitingForPreferredLevel"}, id="during"
        ),
        pytest.param([(10.0, "HeldForEarlierJob")], 5.0, 9.0, set(), id="after"),
    ],
)
def test_holds_between(
    changes: list[tuple[float, str]], since: float, until: float, expected: set[str]
) -> None:
    assert holds_between(changes, since, until) == expected


def test_utilisation_counts_only_while_gangs_wait() -> None:
    # One node: a runs 0-10; b arrives at 1 and runs 11-21 (1 s idle between).
    first = gang("a", 0.0, pod("a", "n1", 0.0, 10.0))
    second = gang("b", 1.0, pod("b", "n1", 11.0, 21.0))
    use = utilisation([first, second], 8)
    assert use["seconds_with_gangs_waiting"] == 10.0  # b waits 1 -> 11
    assert use["utilisation_while_waiting"] == 0.9  # busy 9 of those 10 s
    assert use["of_packable_bound"] == 0.9


@pytest.mark.parametrize(
    ("sizes", "limit", "expected"),
    [([3, 5, 9], 12, 12), ([8, 8], 15, 8), ([], 4, 0), ([2], 0, 0)],
)
def test_subset_sum(sizes: list[int], limit: int, expected: int) -> None:
    assert subset_sum(sizes, limit) == expected


def test_greedy_makespan_backfills_in_order() -> None:
    # Two nodes: a (2 nodes, 10 s), b (2 nodes, 10 s), c (1 node, 5 s) all at 0.
    assert greedy_makespan([(0.0, 2, 10.0), (0.0, 2, 10.0), (0.0, 1, 5.0)], 2) == 25.0
    with pytest.raises(ValueError, match="never fits"):
        greedy_makespan([(0.0, 3, 1.0)], 2)


def test_makespan_and_waits_by_size() -> None:
    first = gang("a", 0.0, pod("a", "n1", 0.5, 10.5), run=10.0)
    second = gang("b", 0.0, pod("b", "n1", 11.0, 21.0), run=10.0)
    span = makespan([first, second], capacity=8, nodes=1)
    assert span["measured_seconds"] == 21.0
    assert span["fluid_bound_seconds"] == 20.0
    waits = waits_by_size([first, second])
    assert waits["1 nodes"]["max"] == 11.0


def test_room_reserved_for_an_earlier_gang_counts_from_that_gangs_release() -> None:
    """b's node freed at 10, but it was held for `big` until big was released at 14.8."""
    first = gang("a", 0.0, pod("a", "n1", 1.0, 10.0))
    big = gang("big", 1.0, pod("big", "n2", 15.0, None))
    second = gang("b", 2.0, pod("b", "n1", 16.0, None))
    held = {"b": [(3.0, "NotEnoughResources"), (11.0, "HeldForEarlierJob"), (15.5, "Placing")]}
    summary = summarize_gangs([first, big, second], 8, held, {"b": ["big"]})
    assert summary["handoff_lag_seconds"]["max"] == 6.0  # 16 - 10, as before
    assert summary["handoff_lag_room_not_reserved_seconds"]["max"] == 1.2  # 16 - 14.8
    # A holder placed after the gang started (it was overtaken) does not move its room.
    late = gang("big", 1.0, pod("big", "n2", 30.0, None))
    again = summarize_gangs([first, late, second], 8, held, {"b": ["big"]})
    assert again["handoff_lag_room_not_reserved_seconds"]["max"] == 6.0
