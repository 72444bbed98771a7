"""Benchmark: the operator's memory with BENCH_JOBS TrainingJobs x 4 workers Running.

Phase A of bench_scale.py alone (its helpers, its namespace and job shape), on a cluster
of its own (state `bench-memory-cluster`, or BENCH_STATE): one `kubectl apply
--server-side` of the jobs, wait until every worker runs and every job reported
allRunningTime, then read the operator's VmHWM (peak RSS) and VmRSS. Nothing else is
measured, so a run costs the cluster's start and one apply.

With TRAINWAVE_TRACEMALLOC=N in the environment (frames per allocation; heap_report.py),
the operator traces its allocations and, at the peak, is sent SIGUSR2: its report of the
largest holders by line, file and package is copied into the results. Tracing inflates
RSS (bookkeeping per allocation), so the RSS of such a run is not the figure to report:
run once without it for the RSS, once with it for where the memory goes.

Environment: BENCH_JOBS (500), BENCH_GPUS (1), BENCH_TOPOLOGY (large; xlarge is 4,096
nodes), BENCH_TAG (results are tests/benchmarks/results/memory-<topology>-<jobs>[-TAG].*),
BENCH_KEEP_CLUSTER (0; 1 leaves the cluster up for the next run), BENCH_STATE.
"""

from __future__ import annotations

import json
import os
import platform
import signal
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))

from benchmarks import bench_scale as scale  # noqa: E402
from benchmarks import scale_measures as measures  # noqa: E402
from benchmarks import scale_settings as settings  # noqa: E402
from benchmarks.operator_cluster import operator_cluster  # noqa: E402
from benchmarks.provenance import git_commit, write_results  # noqa: E402
from cluster.controlplane import cache_dir  # noqa: E402

JOBS = settings.JOBS
TOPOLOGY_NAME = settings.TOPOLOGY_NAME
STATE_NAME = os.environ.get("BENCH_STATE", "bench-memory-cluster")
TAG = os.environ.get("BENCH_TAG", "")
TRACING = os.environ.get("TRAINWAVE_TRACEMALLOC", "0") not in ("", "0")
RESULTS = (
    REPO
    / "tests"
    / "benchmarks"
    / "results"
    / (f"memory-{TOPOLOGY_NAME}-{JOBS}" + (f"-{TAG}" if TAG else ""))
)


def main() -> int:
    started = time.monotonic()
    commit = git_commit()  # at the start: a commit landing mid-run must not relabel it
    load = measures.LoadSampler()
    load.start()
    heap_file = cache_dir() / STATE_NAME / "heap-report.txt"
    heap_file.parent.mkdir(parents=True, exist_ok=True)
    heap_file.unlink(missing_ok=True)
    if TRACING:
        os.environ["TRAINWAVE_TRACEMALLOC_OUT"] = str(heap_file)
    with operator_cluster(
        settings.TOPOLOGY,
        STATE_NAME,
        settings.NAMESPACE,
        # Audited as bench_scale audits: a cluster kept by it (BENCH_STATE) is reused, not
        # restarted for a different audit policy (4,096 nodes take minutes to come up).
        audit_users=[measures.OPERATOR_USER],
        keep_cluster=settings.KEEP_CLUSTER,
        start_timeout=600 if TRACING else 60,
        cluster_timeout=settings.CLUSTER_TIMEOUT,
    ) as bench:
        api = scale.Api(bench.cluster)
        nodes = len(api.names("/api/v1/nodes"))
        settled = scale.settle(api, nodes) if bench.cluster.started else 0.0
        assert bench.operator.process is not None
        pid = bench.operator.process.pid
        idle = status_mib(pid)
        print(f"{nodes} nodes, settled in {settled:.0f}s; operator idle: {idle}", flush=True)
        load.enter("trainwave")
        applied = time.time()
        apply_seconds = scale.apply(bench.cluster, scale.job_manifests())
        all_running, running = scale.wait_running(api, JOBS * settings.WORKERS, applied)
        reported = wait_all_running_reported(api, time.time() + 120)
        loaded = status_mib(pid)
        cpu = measures.process_cpu_seconds(pid)
        heap = ""
        if TRACING:
            os.kill(pid, signal.SIGUSR2)
            # With 8 frames the operator takes minutes to group 2,000 jobs' traces.
            heap = wait_for_text(heap_file, 900)
        load.enter("cleanup")
        scale.clear(bench.cluster, api, load)
    result = {
        "jobs": JOBS,
        "pods": JOBS * settings.WORKERS,
        "nodes": nodes,
        "tracemalloc": TRACING,
        "apply_seconds": round(apply_seconds, 1),
        "all_running": all_running,
        "pods_running": running,
        "jobs_reporting_all_running": reported,
        "apply_to_checked_seconds": round(time.time() - applied, 1),
        "operator_idle_mib": idle,
        "operator_loaded_mib": loaded,
        "operator_cpu_seconds": cpu,
        "conditions": {
            "date": time.strftime("%Y-%m-%d %H:%M %Z"),
            "commit": commit,
            "topology": f"{settings.TOPOLOGY.relative_to(REPO)}: {nodes} nodes",
            "job_shape": f"{JOBS} TrainingJobs x {settings.WORKERS} workers x {settings.GPUS} GPU",
            "machine": f"{os.cpu_count()} cores, Python {platform.python_version()}, shared",
            "load_average_1m": {"trainwave": load.during("trainwave")},
            "run_seconds": round(time.monotonic() - started, 1),
        },
    }
    write_results(RESULTS, result, report(result, heap))
    print(report(result, heap))
    return 0 if all_running else 1


def status_mib(pid: int) -> dict[str, float]:
    """VmRSS (now) and VmHWM (peak) of a process, in MiB."""
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        field, _, rest = line.partition(":")
        if field in ("VmRSS", "VmHWM"):
            values[field] = round(int(rest.split()[0]) / 1024, 1)
    return values


def wait_all_running_reported(api: scale.Api, deadline: float) -> int:
    """Until every job's status has allRunningTime (the operator's last write of the
    burst) or the deadline; how many have it."""
    path = f"/apis/trainwave.io/v1alpha1/namespaces/{settings.NAMESPACE}/trainingjobs"
    done = 0
    while time.time() < deadline:
        jobs = api.full(path)
        done = sum(1 for j in jobs if (j.get("status") or {}).get("allRunningTime"))
        if done >= JOBS:
            break
        time.sleep(settings.POLL_SECONDS)
    return done


def wait_for_text(path: Path, timeout: float) -> str:
    """The heap report once the operator has written it whole (it ends with a blank line)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if path.exists() and path.read_text().endswith("\n\n"):
            return path.read_text()
        time.sleep(1)
    return f"(no heap report in {path} after {timeout:.0f} s)"


def report(result: dict[str, Any], heap: str) -> str:
    c = result["conditions"]
    loaded = result["operator_loaded_mib"]
    text = f"""# Operator memory: {c["job_shape"]} on {c["topology"]}

- all {result["pods"]} workers Running: {result["all_running"]}; jobs with allRunningTime: {result["jobs_reporting_all_running"]}
- operator before the apply (VmRSS): {result["operator_idle_mib"].get("VmRSS")} MiB
- operator with every job Running: VmRSS {loaded.get("VmRSS")} MiB, **peak (VmHWM) {loaded.get("VmHWM")} MiB**
- tracemalloc on: {result["tracemalloc"]} (when on, RSS includes its bookkeeping: not a figure to report)
- operator CPU since its start: {result["operator_cpu_seconds"]} s; apply {result["apply_seconds"]} s

Conditions: {json.dumps(c)}
"""
    if heap:
        text += (
            "\n## The operator's heap report at the peak (heap_report.py)\n\n```\n"
            + heap.strip()
            + "\n```\n"
        )
    return text


if __name__ == "__main__":
    sys.exit(main())
