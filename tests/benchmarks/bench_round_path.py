"""Benchmark: the operator's placement path for one gang placed at creation, without a cluster.

What `Placer.place_now` runs for each new TrainingJob, in the operator's own order and code:
the workers' records from the built pods, the cache's view (controller/clusterview.py), the
snapshot through the placer's memo with the topology reused, the nodes' marks, the one-ticket
round (placement/round.py) and the chosen nodes' inventories; then the gang's pods are put
into the cache as bound, as the pod watch would. Gangs of 4 workers x 1 GPU arrive one after
another, as in bench_scale.py; the first `warm` are placed untimed, the next `measured` are
timed (perf_counter around the path) and profiled apart.

This is the operator's CPU per gang that grows with the nodes: at 2,000 jobs on 4,096 nodes
the rounds were two fifths of the operator's CPU (bench_scale.py's profile, 2026-11-29).

With BENCH_ROUND_COMPARE=<git revision> the same path at that revision runs in the same
process run, alternating with this tree (BENCH_ROUND_REPEATS times each), from a temporary
git worktree: the before and after of one change on one machine at one load.

Environment: BENCH_ROUND_TOPOLOGIES (large,xlarge), BENCH_ROUND_REPEATS (3),
BENCH_ROUND_COMPARE (unset). Results: tests/benchmarks/results/round-path.{json,md}
(BENCH_TAG=x: round-path-x). One core, about a minute per topology and tree.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "tests" / "benchmarks" / "results"
# (gangs placed untimed first, gangs timed) per topology: the cluster half to three
# quarters full, as bench_scale.py's last jobs find it.
SIZES = {"large": (300, 200), "xlarge": (1500, 300)}


def measure(root: Path, topology: str) -> dict[str, Any]:
    """Rounds of the tree at `root` on `topology`; run in a process of its own (imports)."""
    sys.path[:0] = [str(root / "operator"), str(REPO / "tests")]
    from cluster.topology import build_nodes, load_topology
    from trainwave.api.trainingjob import parse_trainingjob
    from trainwave.builders.pods import build_worker_pods
    from trainwave.controller.clusterview import ClusterIndex
    from trainwave.controller.placement_inputs import with_admission_defaults
    from trainwave.placement.marks import close_marked, marks_of
    from trainwave.placement.queueing import PendingJob
    from trainwave.placement.records import node_record, pod_record
    from trainwave.placement.round import Ticket, plan_round
    from trainwave.placement.topology import DEFAULT_LEVELS
    from trainwave.resolving import resolve_job

    try:
        from trainwave.placement.node_memo import NodeInfoMemo
    except ImportError:  # before 2026-11-29 the memo lived in snapshot.py
        from trainwave.placement.snapshot import NodeInfoMemo  # type: ignore[attr-defined,no-redef]

    warm, measured = SIZES[topology]
    nodes = build_nodes(
        load_topology(REPO / "tests" / "cluster" / "topologies" / f"{topology}.yaml")
    )
    index = ClusterIndex()
    index.replace_nodes({n["metadata"]["name"]: node_record(n) for n in nodes})
    memo = NodeInfoMemo()
    known: list[Any] = [None]  # (labels_version, topology) as the placer keeps it
    now = datetime.now(UTC)

    def one(i: int) -> float:
        body = {
            "apiVersion": "trainwave.io/v1alpha1",
            "kind": "TrainingJob",
            "metadata": {"name": f"scale-{i:04d}", "namespace": "bench", "uid": f"uid-{i}"},
            "spec": {"workers": 4, "gpusPerWorker": 1, "image": "bench:1"},
        }
        resolved = resolve_job(parse_trainingjob(body))
        pods = build_worker_pods(resolved, (0, 1, 2, 3), 0)
        for pod in pods:
            pod["metadata"]["namespace"] = "bench"
        started = time.perf_counter()
        records = [pod_record(with_admission_defaults(pod)) for pod in pods]
        view = index.view()
        last = known[0]
        reuse = last[1] if last and last[0] == view.labels_version else None
        snapshot = view.snapshot(DEFAULT_LEVELS, topology=reuse, memo=memo)
        known[0] = (view.labels_version, snapshot.topology)
        marks = marks_of(view.nodes)
        if marks:
            snapshot = close_marked(snapshot, marks, now)
        request = replace(resolved.gang, workers=4, pod=records[0].needs)
        job = PendingJob(f"bench/scale-{i:04d}", request, 0, float(i), 0)
        placement = plan_round(snapshot, [Ticket(job, None)], now).admitted[0].placement
        _inventories(view, list(placement.nodes))
        elapsed = time.perf_counter() - started
        _bind(index, pod_record, pods, placement.nodes, i)
        return elapsed

    for i in range(warm):
        one(i)
    times = sorted(one(i) for i in range(warm, warm + measured))
    return {
        "topology": topology,
        "nodes": len(nodes),
        "gangs_placed_before": warm,
        "rounds": measured,
        "mean_ms": round(1000 * statistics.fmean(times), 2),
        "p50_ms": round(1000 * times[len(times) // 2], 2),
        "p99_ms": round(1000 * times[int(len(times) * 0.99)], 2),
    }


def _inventories(view: Any, names: list[str]) -> dict[str, Any]:
    """The chosen nodes' inventories as the tree's placer gathers them."""
    if hasattr(view, "inventories"):
        return dict(view.inventories(names))
    return {n.name: n.inventory for n in view.nodes if n.inventory is not None}


def _bind(index: Any, pod_record: Any, pods: list[dict[str, Any]], nodes: Any, i: int) -> None:
    """The gang's pods into the cache as the pod watch brings them once bound and Running."""
    for pod, node in zip(pods, nodes, strict=True):
        pod["spec"]["nodeName"] = node
        pod["spec"].pop("schedulingGates", None)
        pod["status"] = {"phase": "Running"}
        pod["metadata"]["uid"] = f"{i}-{pod['metadata']['name']}"
        index.put_pod(f"bench/{pod['metadata']['name']}", pod_record(pod))


def run_in(root: Path, topology: str) -> dict[str, Any]:
    """`measure` in a fresh interpreter, so each tree imports its own trainwave."""
    code = f"import json, sys; sys.path.insert(0, {str(REPO / 'tests')!r}); from benchmarks.bench_round_path import measure; print(json.dumps(measure(__import__('pathlib').Path({str(root)!r}), {topology!r})))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=REPO, check=True, capture_output=True, text=True
    ).stdout.strip()


def main() -> int:
    from benchmarks.provenance import git_commit, write_results

    topologies = os.environ.get("BENCH_ROUND_TOPOLOGIES", "large,xlarge").split(",")
    repeats = int(os.environ.get("BENCH_ROUND_REPEATS", "3"))
    compare = os.environ.get("BENCH_ROUND_COMPARE", "")
    trees: dict[str, Path] = {git_commit(): REPO}
    with tempfile.TemporaryDirectory(prefix="round-path-") as scratch:
        if compare:
            before = Path(scratch) / "before"
            git("worktree", "add", "--detach", "-q", str(before), compare)
            trees = {git("rev-parse", "--short", compare): before, **trees}
        try:
            runs = [
                {"tree": name, **run_in(root, topology)}
                for topology in topologies
                for _ in range(repeats)
                for name, root in trees.items()
            ]
        finally:
            if compare:
                git("worktree", "remove", "--force", str(Path(scratch) / "before"))
    result = {
        "benchmark": "round-path",
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": git_commit(),
        "compared_with": compare or None,
        "machine": {"cores": os.cpu_count(), "python": platform.python_version()},
        "load_average_1m_after": round(os.getloadavg()[0], 2),
        "runs": runs,
    }
    tag = os.environ.get("BENCH_TAG", "")
    write_results(RESULTS / ("round-path" + (f"-{tag}" if tag else "")), result, report(result))
    print(report(result))
    return 0


def report(result: dict[str, Any]) -> str:
    lines = [
        "# One gang placed at creation: the operator's placement path, no cluster",
        "",
        f"{result['date']}, commit {result['commit']}"
        + (f" against {result['compared_with']}" if result["compared_with"] else "")
        + f"; 1-minute load after: {result['load_average_1m_after']}",
        "",
        "| tree | topology | nodes | gangs placed before | rounds | mean ms | p50 ms | p99 ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run in result["runs"]:
        lines.append(
            f"| {run['tree']} | {run['topology']} | {run['nodes']} | {run['gangs_placed_before']}"
            f" | {run['rounds']} | {run['mean_ms']} | {run['p50_ms']} | {run['p99_ms']} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.path.insert(0, str(REPO / "tests"))
    sys.exit(main())
