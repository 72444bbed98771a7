"""bench_scale's settings: which run (topology, jobs, goals), read once from the environment
(bench_scale.py's docstring lists the variables), shared by bench_scale, its report and
bench_memory."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# The runs docs/benchmarks/scale.md reports, by topology: (jobs, results' name, goals). Any other
# size is a smoke run. xlarge's goals are issue 27's for 4,096 nodes.
NAMED_RUNS: dict[str, tuple[int, str, dict[str, float]]] = {
    "large": (500, "scale", {"trainwave_over_bare": 1.5, "job_p99_seconds": 30.0,
                             "round_p99_seconds": 0.25, "peak_rss_mib": 200.0}),
    "xlarge": (2000, "scale-xlarge", {"trainwave_over_bare": 1.1, "job_p99_seconds": 5.0,
                                      "round_p99_seconds": 0.25, "peak_rss_mib": 250.0}),
}  # fmt: skip
TOPOLOGY_NAME = os.environ.get("BENCH_TOPOLOGY", "large")
FULL_JOBS, RUN_NAME, GOALS = NAMED_RUNS.get(TOPOLOGY_NAME, NAMED_RUNS["large"])
JOBS = int(os.environ.get("BENCH_JOBS", str(FULL_JOBS)))
WORKERS = 4
GPUS = int(os.environ.get("BENCH_GPUS", "1"))
TOPOLOGY = REPO / "tests" / "cluster" / "topologies" / f"{TOPOLOGY_NAME}.yaml"
PROFILE = os.environ.get("BENCH_PROFILE", "1") == "1"
KEEP_CLUSTER = os.environ.get("BENCH_KEEP_CLUSTER", "0") == "1"
# Reconcile workers of the operator; empty: its default (8). A diagnostic, written apart.
OPERATOR_WORKERS = os.environ.get("BENCH_OPERATOR_WORKERS", "")
# Appended to the results' name, so a repeat does not replace the reference run.
TAG = os.environ.get("BENCH_TAG", "")
AUDIT_ALL = os.environ.get("BENCH_AUDIT_ALL", "0") == "1"
# Phase B once more with phase A's worker pods as the operator wrote them (bench_scale.py
# worker_copy): what the pods' content costs, apart from what the operator costs.
BARE_AS_WORKERS = os.environ.get("BENCH_BARE_AS_WORKERS", "1") == "1"
NAMESPACE = "bench-scale"
# A cluster of its own per topology, so a 1,024-node run never reshapes a 4,096-node one.
STATE_NAME = os.environ.get(
    "BENCH_STATE", "bench-scale-cluster" + (f"-{TOPOLOGY_NAME}" if TOPOLOGY_NAME != "large" else "")
)
SMOKE = JOBS != FULL_JOBS or TOPOLOGY_NAME not in NAMED_RUNS


def results_stem(name: str) -> Path:
    """Where a run's results go: `name`, then the diagnostic worker count and the tag."""
    workers = f"-workers{OPERATOR_WORKERS}" if OPERATOR_WORKERS else ""
    return REPO / "tests" / "benchmarks" / "results" / (name + workers + (f"-{TAG}" if TAG else ""))


RESULTS = results_stem("scale-smoke" if SMOKE else RUN_NAME)
PHASE_TIMEOUT = 1800.0
CLUSTER_TIMEOUT = 900.0  # 4,096 new nodes: created, Ready and untainted
POLL_SECONDS = 2.0
BARE_LABEL = "bench-scale/bare"
