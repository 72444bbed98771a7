"""Benchmark: trainwave gang placement vs. plain pods under kube-scheduler, same cluster, same mix.

One run, one local cluster (tests/cluster/topologies/medium-64.yaml: 2 spines x 4 racks x
8 nodes x 8 GPUs), chart installed, operator running as its ServiceAccount
(benchmarks/operator_cluster.py, shared with bench_apply_to_running.py).

- Phase A, trainwave: the seeded mix (benchmarks/gang_mix.py) as TrainingJobs.
- Phase B, after every job and pod of A is gone and the operator is stopped: the same mix
  as bare Pods with the same requests (`nvidia.com/gpu` limits), no gate, no affinity, bound
  by kube-scheduler with its default profile. Its rank = the pod's index in the job.

Jobs arrive one at a time and never finish by themselves (no sim annotations); each is
measured when all its workers are bound, and leaves when the mix says so
(benchmarks/gang_arrivals.py explains the protocol and why it is sequential).

Measured, per placer, for multi-node jobs (more GPUs than one node has): share placed
inside one rack (overall, and among jobs for which some rack had room when they arrived;
goal >= 95% for trainwave), mean racks per job, cross-rack neighbour pairs (ranks i, i+1 in
different racks); for every job, submit -> all workers bound. Checked: trainwave's live
placements against the pure engine replaying the same stream (benchmarks/engine_replay.py).

Run: `make bench` or `python tests/benchmarks/bench_placement_vs_scheduler.py`.
Env: BENCH_JOBS (default 150; 8 for a smoke run), BENCH_SEED (default 2026).
Writes tests/benchmarks/results/placement_vs_scheduler.{json,md}. About 5 min on 2 cores.
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "operator"), str(REPO / "tests")]

from benchmarks.engine_replay import agreement, replay  # noqa: E402
from benchmarks.gang_arrivals import (  # noqa: E402
    Api,
    Arrival,
    PhaseRun,
    Placer,
    SchedulerPlacer,
    TrainwavePlacer,
    run_arrivals,
)
from benchmarks.gang_mix import (  # noqa: E402
    CPU_PER_GPU,
    MEAN_STAY,
    MEMORY_GIB_PER_GPU,
    SHAPES,
    make_mix,
)
from benchmarks.operator_cluster import operator_cluster  # noqa: E402
from benchmarks.placement_quality import Fleet, Quality  # noqa: E402
from benchmarks.provenance import git_commit, write_results  # noqa: E402
from benchmarks.summaries import spread  # noqa: E402
from trainwave.placement.snapshot import build_snapshot  # noqa: E402

JOBS = int(os.environ.get("BENCH_JOBS", "150"))
SEED = int(os.environ.get("BENCH_SEED", "2026"))
TOPOLOGY = REPO / "tests" / "cluster" / "topologies" / "medium-64.yaml"
NAMESPACE = "bench-placement"
RESULTS = REPO / "tests" / "benchmarks" / "results" / "placement_vs_scheduler"
GOAL_SINGLE_RACK_WHEN_ROOM = 0.95


def main() -> int:
    mix = make_mix(SEED, JOBS)
    phases: dict[str, dict[str, Any]] = {}
    runs: dict[str, PhaseRun] = {}
    loads: dict[str, float] = {}
    started = time.monotonic()
    with operator_cluster(TOPOLOGY, "bench-placement-cluster", NAMESPACE) as bench:
        api = Api(str(bench.cluster.kubeconfig), NAMESPACE)
        nodes = api.nodes()
        fleet = Fleet(build_snapshot(nodes, []))
        placers: list[Placer] = [TrainwavePlacer(api), SchedulerPlacer(api)]
        for placer in placers:
            if isinstance(placer, SchedulerPlacer):
                # Nothing of trainwave may touch phase B's pods or share its CPU.
                bench.operator.stop()
            loads[placer.name] = round(os.getloadavg()[0], 2)
            print(f"{placer.name}: {len(mix)} jobs", flush=True)
            phase_started = time.monotonic()
            runs[placer.name] = run_arrivals(placer, api, mix, log=sys.stdout)
            phases[placer.name] = summarize(runs[placer.name].arrivals, fleet)
            phases[placer.name]["phase_seconds"] = round(time.monotonic() - phase_started, 1)
    resources = same_worker_resources(runs)
    replayed = replay(mix, nodes)
    phases["trainwave"]["engine_replay"] = {
        "agreement": agreement(runs["trainwave"].arrivals, replayed),
        "quality": summarize(replayed, fleet)["quality"],
    }
    result = {**phases, "conditions": conditions(mix, loads, time.monotonic() - started)}
    result["conditions"]["worker_resources"] = resources
    write_results(RESULTS, result, report(result))
    print(report(result))
    share = phases["trainwave"]["quality"]["single_rack_share_when_room"]
    verdict = "met" if share >= GOAL_SINGLE_RACK_WHEN_ROOM else "MISSED"
    print(f"goal >= 95% inside one rack when a rack had room (trainwave): {verdict}")
    return 0


def summarize(arrivals: list[Arrival], fleet: Fleet) -> dict[str, Any]:
    quality = Quality()
    for arrival in arrivals:
        if arrival.multi_node and arrival.outcome == "placed":
            nodes = [n for n in arrival.nodes if n is not None]
            quality.record(arrival.rack_had_room, fleet.racks_of(nodes))
    placed = [a for a in arrivals if a.outcome == "placed"]
    multi = [a for a in arrivals if a.multi_node]
    after_fill = [a.cluster_use_before for a in arrivals[MEAN_STAY:] or arrivals]
    return {
        "outcomes": dict(sorted(Counter(a.outcome for a in arrivals).items())),
        "multi_node_jobs": len(multi),
        "multi_node_jobs_with_rack_room": sum(a.rack_had_room for a in multi),
        "quality": quality.summary(),
        "submit_to_all_bound_seconds": spread([a.seconds_to_all_bound or 0.0 for a in placed], 2),
        "cluster_use_before_arrival": {
            "mean_after_first_stay": round(statistics.fmean(after_fill), 3),
            "max": round(max(a.cluster_use_before for a in arrivals), 3),
        },
        "not_placed": [
            {
                "job": a.job,
                "outcome": a.outcome,
                "bound": f"{a.workers_bound}/{a.workers}",
                "cluster_had_room": a.cluster_had_room,
                "reason": a.reason[:200],
            }
            for a in arrivals
            if a.outcome != "placed"
        ],
        "jobs": [a.to_json() for a in arrivals],
    }


def same_worker_resources(runs: dict[str, PhaseRun]) -> dict[str, Any]:
    """Refuse a comparison in which the two placers were asked for different resources."""
    seen = [run.worker_resources for run in runs.values()]
    if any(resources != seen[0] for resources in seen[1:]):
        raise RuntimeError(f"worker resources differ between placers: {seen}")
    return seen[0]


def conditions(mix: list[Any], loads: dict[str, float], seconds: float) -> dict[str, Any]:
    shapes = ", ".join(f"{w}x{g} {weight}%" for w, g, weight in SHAPES)
    return {
        "topology": f"{TOPOLOGY.relative_to(REPO)}: 64 nodes x 8 H100 = 512 GPUs, "
                    "2 spines x 4 racks x 8 nodes",
        "mix": f"{len(mix)} jobs, seed {SEED}; workers x GPUs per worker by weight: {shapes}; "
               f"per worker {CPU_PER_GPU} CPU and {MEMORY_GIB_PER_GPU} GiB per GPU",
        "stay": f"exponential, mean {MEAN_STAY} arrivals; then the job is deleted",
        "arrivals": "sequential: departures deleted and gone, snapshot read, one job "
                    "submitted, polled every 0.1 s until all bound or the placer gives up; a "
                    "job not placed whole is withdrawn at once in either phase",
        "trainwave": "operator as the chart's ServiceAccount, default topology levels "
                     "(spine, rack, hostname), no spec.placement",
        "kube_scheduler": "v1.34.4 default profile (NodeResourcesFit LeastAllocated on "
                          "cpu/memory); operator stopped in this phase",
        "control_plane": "kube-apiserver/scheduler/controller-manager v1.34.4, etcd 3.5.1, "
                         "kwok v0.8.0; kwok marks bound pods Running at once",
        "machine": f"{os.cpu_count()} cores, {platform.machine()}, "
                   f"Python {platform.python_version()}; everything shares these cores",
        "load_average_1m_at_phase_start": loads,
        "run_seconds": round(seconds, 1),
        "date": time.strftime("%Y-%m-%d"),
        "kernel": platform.release(),
        "commit": git_commit(),
    }  # fmt: skip


def report(result: dict[str, Any]) -> str:
    rows = []
    for name in ("trainwave", "kube-scheduler"):
        phase = result[name]
        q = phase["quality"]
        bound = phase["submit_to_all_bound_seconds"]
        rows.append(
            f"| {name} | {q['multi_node_jobs_placed']}/{phase['multi_node_jobs']} "
            f"| {q['single_rack_share']:.1%} "
            f"| {q['single_rack_share_when_room']:.1%} ({q['with_room_in_one_rack']}) "
            f"| {q['mean_racks_per_job']:.2f} "
            f"| {q['cross_rack_neighbour_pairs']} ({q['cross_rack_pairs_per_job']:.2f}/job) "
            f"| {bound.get('p50', '-')} / {bound.get('p95', '-')} / {bound.get('max', '-')} s "
            f"| {phase['cluster_use_before_arrival']['mean_after_first_stay']:.0%} "
            f"(max {phase['cluster_use_before_arrival']['max']:.0%}) |"
        )
    conditions_text = "\n".join(f"- {k}: {v}" for k, v in result["conditions"].items())
    unplaced = (
        "\n".join(
            f"- {name}: {n['job']} {n['outcome']} ({n['bound']} bound; cluster had room: "
            f"{n['cluster_had_room']}): {n['reason']}"
            for name in ("trainwave", "kube-scheduler")
            for n in result[name]["not_placed"]
        )
        or "- none"
    )
    replayed = result["trainwave"]["engine_replay"]["agreement"]
    same, jobs = replayed["same_nodes"], replayed["jobs"]
    differ = (
        f" (differing: {', '.join(replayed['differing'][:10])})" if replayed["differing"] else ""
    )
    return f"""# Placement vs. kube-scheduler: same cluster, same job mix

Multi-node jobs (more than 8 GPUs). "When room" = among jobs for which some rack had
room for every worker at arrival (count in brackets). Bound time: submit -> last worker
bound, every placed job, p50 / p95 / max.

| placer | multi-node placed whole | inside one rack | inside one rack, when room | racks per job | cross-rack neighbour pairs | submit -> all bound | GPUs in use at arrival (mean after fill) |
|---|---|---|---|---|---|---|---|
{chr(10).join(rows)}

The pure engine replaying the same stream (benchmarks/engine_replay.py) put
{same}/{jobs} jobs on the same node for every rank as the operator did live{differ}.

Jobs not placed whole (withdrawn at once):
{unplaced}

Conditions:
{conditions_text}
"""


if __name__ == "__main__":
    sys.exit(main())
