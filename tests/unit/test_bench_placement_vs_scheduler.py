"""The pure parts of tests/benchmarks/bench_placement_vs_scheduler.py: the mix, the two
manifests built from one job, room per rack, the quality numbers and when kube-scheduler
counts as done. The cluster run itself is the benchmark (make bench)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from benchmarks.bench_placement_vs_scheduler import summarize
from benchmarks.engine_replay import agreement, replay
from benchmarks.gang_arrivals import Arrival, SchedulerPlacer
from benchmarks.gang_mix import (
    PLAIN_INDEX_LABEL,
    MixJob,
    departures,
    make_mix,
    plain_pods,
    requests,
    training_job,
)
from benchmarks.placement_quality import Fleet, Quality
from cluster.topology import build_nodes, load_topology
from trainwave import contract
from unit.placement_factories import TOPOLOGIES, make_cluster, make_request

pytestmark = pytest.mark.timeout(10)


def make_job(workers: int = 4, gpus: int = 8, arrival: int = 0, departure: int = 5) -> MixJob:
    return MixJob(f"mix-{arrival:03d}", workers, gpus, arrival, departure)


def make_arrival(nodes: tuple[str | None, ...], *, room: bool = True, **fields: Any) -> Arrival:
    values: dict[str, Any] = {
        "job": "j", "workers": len(nodes), "gpus_per_worker": 8, "multi_node": len(nodes) > 1,
        "cluster_use_before": 0.5, "rack_had_room": room, "cluster_had_room": True,
        "outcome": "placed", "workers_bound": len(nodes), "seconds_to_all_bound": 0.4,
        "nodes": nodes,
    }  # fmt: skip
    return Arrival(**(values | fields))


def pod(index: int, node: str | None = None, scheduled: dict[str, str] | None = None) -> Any:
    conditions = [{"type": "PodScheduled", **scheduled}] if scheduled else []
    return {
        "metadata": {"labels": {PLAIN_INDEX_LABEL: str(index)}},
        "spec": {"nodeName": node} if node else {},
        "status": {"conditions": conditions},
    }


UNSCHEDULABLE = {"status": "False", "reason": "Unschedulable", "message": "0/64 nodes fit"}


def test_a_seed_fixes_the_mix_and_every_job_leaves_after_it_came() -> None:
    mix = make_mix(2026, 60)
    assert mix == make_mix(2026, 60)
    assert mix != make_mix(2027, 60)
    assert all(job.departure > job.arrival for job in mix)
    assert len({job.name for job in mix}) == 60
    leaving = departures(mix)
    assert all(job.departure == at for at, jobs in leaving.items() for job in jobs)
    assert all(at < 60 for at in leaving), "jobs that would leave after the end stay"


def test_both_manifests_ask_for_the_same_worker_and_neither_finishes_by_itself() -> None:
    job = make_job(workers=3, gpus=4)
    trainwave = training_job(job)
    pods = plain_pods(job)
    assert trainwave["spec"]["resources"]["requests"] == requests(job)
    assert trainwave["spec"]["gpusPerWorker"] == 4
    assert "template" not in trainwave["spec"], "no sim annotations: workers run until deleted"
    assert [p["metadata"]["labels"][PLAIN_INDEX_LABEL] for p in pods] == ["0", "1", "2"]
    for plain in pods:
        (container,) = plain["spec"]["containers"]
        assert container["resources"]["requests"] == requests(job)
        assert container["resources"]["limits"] == {contract.GPU_RESOURCE: "4"}
        assert "schedulingGates" not in plain["spec"]
        assert "affinity" not in plain["spec"]
        assert not plain["metadata"].get("annotations")


@pytest.mark.parametrize(
    ("racks", "workers", "gpus", "room"),
    [
        (([8, 8], [8]), 2, 8, True),
        (([8, 0], [8]), 2, 8, False),
        (([4, 4], [8, 0]), 1, 8, True),
        (([4, 4], [4]), 2, 8, False),
        (([4, 4], [4]), 2, 4, True),
    ],
    ids=["one-rack-fits", "split-across-racks", "one-node-enough", "two-halves-are-not-a-node",
         "half-node-workers-use-halves"],
)  # fmt: skip
def test_rack_room_counts_whole_workers(
    racks: tuple[list[int], ...], workers: int, gpus: int, room: bool
) -> None:
    snapshot = make_cluster(*racks)
    assert Fleet(snapshot).rack_has_room(snapshot.free, make_request(workers, gpus)) is room


@pytest.mark.parametrize(
    ("jobs", "expected"),
    [
        ([(True, [0, 0, 0])], {"single_rack_share": 1.0, "mean_racks_per_job": 1.0,
                               "cross_rack_neighbour_pairs": 0}),
        ([(True, [0, 1, 0, 1])], {"single_rack_share": 0.0, "single_rack_share_when_room": 0.0,
                                  "mean_racks_per_job": 2.0, "cross_rack_neighbour_pairs": 3}),
        ([(False, [0, 0, 1, 1]), (True, [2, 2])], {"single_rack_share": 0.5,
                                                   "with_room_in_one_rack": 1,
                                                   "single_rack_share_when_room": 1.0,
                                                   "cross_rack_neighbour_pairs": 1}),
    ],
    ids=["one-rack", "alternating-ranks", "no-room-is-counted-apart"],
)  # fmt: skip
def test_quality_numbers(jobs: list[tuple[bool, list[int]]], expected: dict[str, float]) -> None:
    quality = Quality()
    for room, racks in jobs:
        quality.record(room, racks)
    summary = quality.summary()
    assert {key: summary[key] for key in expected} == expected


@pytest.mark.parametrize(
    ("pods", "workers", "stuck"),
    [
        ([pod(0, "a"), pod(1, "b")], 2, False),
        ([pod(0, "a"), pod(1)], 2, False),
        ([pod(0, "a"), pod(1, scheduled=UNSCHEDULABLE)], 2, True),
        ([pod(0, scheduled=UNSCHEDULABLE)], 2, False),
        ([pod(0, scheduled=UNSCHEDULABLE), pod(1, scheduled={"status": "True"})], 2, False),
    ],
    ids=["all-bound", "one-not-tried-yet", "rest-unschedulable", "pods-still-being-created",
         "one-still-in-flight"],
)  # fmt: skip
def test_kube_scheduler_is_done_when_every_unbound_pod_is_unschedulable(
    pods: list[Any], workers: int, stuck: bool
) -> None:
    why = SchedulerPlacer(api=None).why_stuck(make_job(workers=workers), pods)  # type: ignore[arg-type]
    assert (why is not None) is stuck
    if stuck:
        assert why == "Unschedulable: 0/64 nodes fit"


def test_summary_scores_only_multi_node_jobs_placed_whole() -> None:
    fleet = Fleet(make_cluster([8, 8], [8, 8]))
    arrivals = [
        make_arrival(("r0-n0", "r0-n1")),
        make_arrival(("r0-n0", "r1-n0"), room=False),
        make_arrival(("r1-n1",)),
        make_arrival(("r1-n0", None), outcome="partly-bound", workers_bound=1,
                     seconds_to_all_bound=None, reason="Unschedulable: no"),
    ]  # fmt: skip
    summary = summarize(arrivals, fleet)
    assert summary["outcomes"] == {"partly-bound": 1, "placed": 3}
    assert summary["multi_node_jobs"] == 3
    assert summary["quality"]["multi_node_jobs_placed"] == 2
    assert summary["quality"]["single_rack_share"] == 0.5
    assert summary["quality"]["single_rack_share_when_room"] == 1.0
    assert [n["bound"] for n in summary["not_placed"]] == ["1/2"]
    assert summary["submit_to_all_bound_seconds"]["max"] == 0.4


def test_the_engine_replay_keeps_gangs_in_a_rack_and_frees_what_leaves() -> None:
    nodes = build_nodes(load_topology(TOPOLOGIES / "small.yaml"))  # 2 racks x 4 nodes x 8
    mix = [
        make_job(4, 8, arrival=0, departure=2),
        make_job(4, 8, arrival=1, departure=9),
        make_job(2, 8, arrival=2, departure=9),  # fits only because job 0 left
        make_job(3, 8, arrival=3, departure=9),  # 2 whole nodes left: never fits
    ]
    replayed = replay(mix, nodes)
    assert [a.outcome for a in replayed] == ["placed", "placed", "placed", "not-placed"]
    racks = [{n.split("-n")[0] for n in a.nodes if n} for a in replayed[:3]]
    assert all(len(r) == 1 for r in racks), racks
    assert racks[0] != racks[1], "the second gang cannot share the first one's full rack"
    assert replayed[3].reason.startswith("NotEnoughGPUs")
    assert agreement(replayed, replayed)["same_nodes"] == 4
    moved = [replace(replayed[0], nodes=tuple(reversed(replayed[0].nodes))), *replayed[1:]]
    assert agreement(moved, replayed)["differing"] == [replayed[0].job]
