"""Benchmark: 100 TrainingJobs x 4 workers, from `kubectl apply` to every pod Running.

Runs on its own local cluster (64 simulated nodes x 8 GPUs, tests/cluster/
topologies/medium-64.yaml) in a separate state directory, with the chart
installed and the operator running as its ServiceAccount, exactly as in the
integration tests. Pods never finish (no sim annotations), so the clock stops
when the last of the 400 workers is Running.

Measured:
- wall time from the start of the apply to the last worker Running (the
  moment is read from the pods' Ready conditions, not from polling);
- per job: creationTimestamp -> status.allRunningTime (p50, p95, max);
- reconciles and their latency, from the operator's own metrics.

Run: `make bench` (or `python tests/benchmarks/bench_apply_to_running.py`).
Writes tests/benchmarks/results/apply_to_running.json and prints a summary.
"""

from __future__ import annotations

import json
import os
import platform
import re
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))

import yaml  # noqa: E402

from benchmarks.operator_cluster import operator_cluster, parse_time  # noqa: E402
from benchmarks.provenance import git_commit  # noqa: E402
from benchmarks.summaries import spread  # noqa: E402

JOBS = int(os.environ.get("BENCH_JOBS", "100"))
WORKERS = int(os.environ.get("BENCH_WORKERS", "4"))
TOPOLOGY = REPO / "tests" / "cluster" / "topologies" / "medium-64.yaml"
NAMESPACE = "bench"
RESULTS = REPO / "tests" / "benchmarks" / "results" / "apply_to_running.json"


def manifests() -> str:
    jobs = [
        {
            "apiVersion": "trainwave.io/v1alpha1",
            "kind": "TrainingJob",
            "metadata": {"name": f"bench-{i:03d}"},
            "spec": {"workers": WORKERS, "gpusPerWorker": 1, "image": "bench:1"},
        }
        for i in range(JOBS)
    ]
    return yaml.safe_dump_all(jobs)


def main() -> int:
    with operator_cluster(TOPOLOGY, "bench-cluster", NAMESPACE) as bench:
        result = run(bench.cluster, bench.operator)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


def run(cluster, operator) -> dict:
    total = JOBS * WORKERS
    load_before = os.getloadavg()[0]
    started = time.time()
    cluster.kubectl("apply", "-n", NAMESPACE, "-f", "-", input=manifests(), timeout=300)
    applied = time.time()
    deadline = started + 900
    while time.time() < deadline:
        phases = cluster.kubectl("get", "pods", "-n", NAMESPACE, "-o",
                                 "jsonpath={.items[*].status.phase}").stdout.split()  # fmt: skip
        if phases.count("Running") == total:
            break
        time.sleep(1)
    else:
        raise TimeoutError(f"not all {total} workers Running after 900s")
    pods = json.loads(cluster.kubectl("get", "pods", "-n", NAMESPACE, "-o", "json").stdout)["items"]
    ready_at = [
        parse_time(c["lastTransitionTime"])
        for p in pods
        for c in p["status"]["conditions"]
        if c["type"] == "Ready" and c["status"] == "True"
    ]
    last_running = max(ready_at)
    # Let the operator write the last statuses before reading them.
    time.sleep(3)
    jobs = json.loads(cluster.kubectl("get", "tj", "-n", NAMESPACE, "-o", "json").stdout)["items"]
    per_job = [
        parse_time(j["status"]["allRunningTime"]) - parse_time(j["metadata"]["creationTimestamp"])
        for j in jobs
        if j.get("status", {}).get("allRunningTime")
    ]
    metrics = operator.metrics()
    reconciles = _metric(metrics, "trainwave_reconcile_duration_seconds_count")
    reconcile_sum = _metric(metrics, "trainwave_reconcile_duration_seconds_sum")
    return {
        "jobs": JOBS,
        "workers_per_job": WORKERS,
        "pods": total,
        "nodes": 64,
        # `kubectl apply` of 100 objects is itself serial (one GET + PATCH each).
        "apply_seconds": round(applied - started, 2),
        # API timestamps have 1 s resolution; the wall clock brackets it.
        "apply_to_all_running_seconds": round(last_running - started, 1),
        "jobs_reporting_all_running": len(per_job),
        "job_all_running_seconds": spread(per_job),
        "reconciles": int(reconciles),
        "mean_reconcile_ms": round(1000 * reconcile_sum / reconciles, 1) if reconciles else None,
        "conditions": {
            "machine": f"{os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()}",
            "control_plane": "kube-apiserver/scheduler/controller-manager v1.34.4, etcd 3.5.1, kwok v0.8.0",
            "operator": "1 process, 4 reconcile workers, chart RBAC (ServiceAccount token)",
            "pods": "kwok marks bound pods Running at once (no image pulls, no kubelet)",
            "date": time.strftime("%Y-%m-%d"),
            # Everything shares 2 cores: the load before the run says how quiet it was.
            "load_average_1m_before": round(load_before, 2),
            "kernel": platform.release(),
            "commit": git_commit(),
        },
    }


def _metric(text: str, name: str) -> float:
    found = re.search(rf"^{name} ([0-9.e+]+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


if __name__ == "__main__":
    sys.exit(main())
