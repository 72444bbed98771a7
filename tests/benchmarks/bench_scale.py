"""Benchmark: 500 TrainingJobs x 4 workers on 1,024 nodes (or 2,000 on 4,096), against
kube-scheduler's own limit.

Runs on its own local cluster (tests/cluster/topologies/large.yaml: 1,024 nodes x 8 GPUs;
xlarge.yaml: 4,096) in its own state directory, with the chart installed, the operator
running as its ServiceAccount, and the API server writing an audit log of that
ServiceAccount's requests (level Metadata; nothing else is audited). One run, three phases, the first started once
the controller manager has finished the writes it makes once for each new node (as phase B
starts on a cluster that finished them long before):

A. trainwave: one `kubectl apply --server-side` of BENCH_JOBS TrainingJobs of 4 workers x
   BENCH_GPUS GPUs that never finish. Measured: apply start -> last of the workers Running
   (read from the pods' Ready conditions), per job creationTimestamp -> status.allRunningTime,
   placement rounds (from the operator's histogram: count, mean, p50/p99 interpolated from
   its buckets), the operator's API requests (from the audit log, watches excluded) per
   placed gang, the operator's peak RSS (VmHWM), the CPU seconds each control-plane
   process and the operator used until all were Running, and optionally a py-spy profile.
B. everything deleted, the operator stopped; the same number of bare Pods with the requests
   phase A's workers got (no gate, no operator) in one `kubectl apply --server-side`;
   kube-scheduler binds them. Measured: apply start -> last pod Running, the control plane's
   own limit on this machine, and the CPU seconds per process as in A (both phases keep
   the 2 cores busy, so the ratio of A to B follows the ratio of CPU they need).
C. everything deleted, the operator still stopped; the same TrainingJobs as in phase A in one
   `kubectl apply --server-side`, nothing acting on them. Measured: the apply's seconds, what
   the API server alone takes to accept the jobs on this machine (phase A's apply shares it
   with the operator's own writes).

Environment: BENCH_TOPOLOGY (large: 500 jobs, results scale.*; xlarge: 4,096 nodes, 2,000
jobs, results scale-xlarge.*, `make bench-scale-xlarge`; medium-64 or a job count other than
the topology's is a smoke run, written to scale-smoke.*), BENCH_JOBS, BENCH_GPUS (1),
BENCH_STATE (the cluster's state directory under the cache; bench-scale-cluster[-topology]),
BENCH_PROFILE (1: py-spy samples the operator during phase A, if installed),
BENCH_KEEP_CLUSTER (0; 1 leaves the cluster up),
BENCH_OPERATOR_WORKERS (the operator's --workers; default its own, 4), BENCH_TAG (appended
to the results' name, for repeats), BENCH_AUDIT_ALL (0; 1 audits every client, not only the
operator, and reports each phase's writes by client: a diagnostic, auditing costs CPU).
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))

import yaml  # noqa: E402

from benchmarks.operator_cluster import operator_cluster, parse_time  # noqa: E402
from benchmarks.provenance import git_commit, write_results  # noqa: E402
from benchmarks.summaries import percentile  # noqa: E402
from cluster.api import ApiClient, ApiError  # noqa: E402
from cluster.components import Layout  # noqa: E402
from cluster.controlplane import Cluster  # noqa: E402
from cluster.deploy import NAMESPACE as OPERATOR_NAMESPACE  # noqa: E402
from cluster.deploy import SERVICE_ACCOUNT, OperatorProcess  # noqa: E402

# The runs docs/benchmarks.md reports, by topology: (jobs, results' name, goals). Any other
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
# Reconcile workers of the operator; empty: its default (4). A diagnostic, written apart.
OPERATOR_WORKERS = os.environ.get("BENCH_OPERATOR_WORKERS", "")
# Appended to the results' name, so a repeat does not replace the reference run.
TAG = os.environ.get("BENCH_TAG", "")
AUDIT_ALL = os.environ.get("BENCH_AUDIT_ALL", "0") == "1"
NAMESPACE = "bench-scale"
# A cluster of its own per topology, so a 1,024-node run never reshapes a 4,096-node one.
STATE_NAME = os.environ.get(
    "BENCH_STATE", "bench-scale-cluster" + (f"-{TOPOLOGY_NAME}" if TOPOLOGY_NAME != "large" else "")
)
OPERATOR_USER = f"system:serviceaccount:{OPERATOR_NAMESPACE}:{SERVICE_ACCOUNT}"
SMOKE = JOBS != FULL_JOBS or TOPOLOGY_NAME not in NAMED_RUNS
RESULTS = (
    REPO
    / "tests"
    / "benchmarks"
    / "results"
    / (
        ("scale-smoke" if SMOKE else RUN_NAME)
        + (f"-workers{OPERATOR_WORKERS}" if OPERATOR_WORKERS else "")
        + (f"-{TAG}" if TAG else "")
    )
)
PHASE_TIMEOUT = 1800.0
CLUSTER_TIMEOUT = 900.0  # 4,096 new nodes: created, Ready and untainted
POLL_SECONDS = 2.0
PROFILE_RATE = 20  # samples/s: a few % of one core
BARE_LABEL = "bench-scale/bare"


def main() -> int:
    started = time.monotonic()
    load = LoadSampler()
    load.start()
    with operator_cluster(
        TOPOLOGY,
        STATE_NAME,
        NAMESPACE,
        audit_users=["*"] if AUDIT_ALL else [OPERATOR_USER],
        keep_cluster=KEEP_CLUSTER,
        operator_args=("--workers", OPERATOR_WORKERS) if OPERATOR_WORKERS else (),
        cluster_timeout=CLUSTER_TIMEOUT,
    ) as bench:
        cluster_ready = time.monotonic() - started
        api = Api(bench.cluster)
        nodes = len(api.names("/api/v1/nodes"))
        print(f"cluster ready in {cluster_ready:.0f}s: {nodes} nodes", flush=True)
        settled_after = settle(api, nodes) if bench.cluster.started else 0.0
        print(f"startup writes done {settled_after:.0f}s later", flush=True)
        phase_a = run_trainwave(bench.cluster, bench.operator, api, bench.workdir, load)
        print(json.dumps({k: v for k, v in phase_a.items() if k != "worker_pod"}), flush=True)
        clear(bench.cluster, api, load)
        bench.operator.stop()
        phase_b = run_bare(bench.cluster, api, phase_a["worker_pod"], load)
        print(json.dumps(phase_b), flush=True)
        clear(bench.cluster, api, load)
        load.enter("jobs-alone")
        phase_b["jobs_alone_apply_seconds"] = round(apply(bench.cluster, job_manifests()), 1)
        print(f"applied {JOBS} jobs, operator stopped, in {phase_b['jobs_alone_apply_seconds']}s")
        clear(bench.cluster, api, load)
    phase_a["settle_seconds"] = round(settled_after, 1)
    result = summarize(phase_a, phase_b, nodes, load, time.monotonic() - started)
    write_results(RESULTS, result, report(result))
    print(report(result))
    return 0


class LoadSampler(threading.Thread):
    """os.getloadavg() every 5 s, tagged with the phase running, for the conditions."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.phase = "setup"
        self.samples: list[tuple[str, float]] = []
        self.at_start: dict[str, float] = {}

    def enter(self, phase: str) -> None:
        self.phase = phase
        self.at_start[phase] = round(os.getloadavg()[0], 2)

    def run(self) -> None:
        while True:
            self.samples.append((self.phase, os.getloadavg()[0]))
            time.sleep(5)

    def during(self, phase: str) -> dict[str, float]:
        values = [v for p, v in self.samples if p == phase]
        if not values:
            return {}
        return {
            "at_start": self.at_start.get(phase, values[0]),
            "mean": round(statistics.fmean(values), 2),
            "max": round(max(values), 2),
        }


class Api:
    """Cheap reads for polling: metadata-only lists from the API server's watch cache."""

    METADATA = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"

    def __init__(self, cluster: Cluster) -> None:
        self.client = ApiClient(cluster.server, Layout(cluster.state_dir).pki, timeout=120)

    def names(self, path: str, field_selector: str = "") -> list[str]:
        return [m["name"] for m in self.metadata(path, field_selector)]

    def metadata(self, path: str, field_selector: str = "") -> list[dict[str, Any]]:
        query = "?resourceVersion=0"
        if field_selector:
            query += f"&fieldSelector={quote(field_selector)}"
        # An empty list comes back as "items": null.
        items = self.client.request("GET", path + query, accept=self.METADATA)["items"] or []
        return [i["metadata"] for i in items]

    def pods_path(self) -> str:
        return f"/api/v1/namespaces/{NAMESPACE}/pods"

    def running(self) -> int:
        return len(self.names(self.pods_path(), "status.phase=Running"))

    def full(self, path: str) -> list[dict[str, Any]]:
        return list(self.client.get(path + "?resourceVersion=0")["items"])


def apply(cluster: Cluster, objects: list[dict[str, Any]]) -> float:
    """One server-side apply of all `objects` (one PATCH each, no GET); its seconds."""
    started = time.time()
    cluster.kubectl(
        "apply", "--server-side", "--field-manager=bench-scale", "-n", NAMESPACE, "-f", "-",
        input=yaml.safe_dump_all(objects), timeout=1200,
    )  # fmt: skip
    return time.time() - started


def wait_running(api: Api, total: int, started: float) -> tuple[bool, int]:
    """Poll until `total` pods are Running; (all Running, how many) at the end."""
    running = 0
    while time.time() < started + PHASE_TIMEOUT:
        running = api.running()
        if running >= total:
            return True, running
        time.sleep(POLL_SECONDS)
    return False, running


def last_ready(api: Api) -> float:
    """The latest Ready transition among the Running pods (API time, 1 s resolution)."""
    pods = api.full(api.pods_path())
    return max(
        parse_time(c["lastTransitionTime"])
        for p in pods
        for c in p["status"].get("conditions", [])
        if c["type"] == "Ready" and c["status"] == "True"
    )


def job_manifests() -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": "trainwave.io/v1alpha1",
            "kind": "TrainingJob",
            "metadata": {"name": f"scale-{i:03d}", "namespace": NAMESPACE},
            "spec": {"workers": WORKERS, "gpusPerWorker": GPUS, "image": "bench:1"},
        }
        for i in range(JOBS)
    ]


def run_trainwave(
    cluster: Cluster, operator: OperatorProcess, api: Api, workdir: Path, load: LoadSampler
) -> dict[str, Any]:
    total = JOBS * WORKERS
    audit_log = Layout(cluster.state_dir).audit_log
    audit_offset = audit_log.stat().st_size if audit_log.exists() else 0
    metrics_before = parse_metrics(operator.metrics())
    assert operator.process is not None
    pid = operator.process.pid
    profiler = Profiler(pid, workdir / "profile.txt") if PROFILE else None
    load.enter("trainwave")
    cpu_before = component_cpu(cluster, pid)
    started = time.time()
    apply_seconds = apply(cluster, job_manifests())
    print(f"applied {JOBS} jobs in {apply_seconds:.1f}s", flush=True)
    all_running, running = wait_running(api, total, started)
    cpu = cpu_delta(cpu_before, component_cpu(cluster, pid))
    reached = time.time()
    last = last_ready(api) if running else None
    # The operator writes allRunningTime after the last pod turns Running: wait for it.
    jobs: list[dict[str, Any]] = []
    while time.time() < reached + 120:
        jobs = api.full(f"/apis/trainwave.io/v1alpha1/namespaces/{NAMESPACE}/trainingjobs")
        if all(j.get("status", {}).get("allRunningTime") for j in jobs):
            break
        time.sleep(POLL_SECONDS)
    settled = time.time()
    peak_rss_mib = vm_hwm_mib(pid)
    profile = profiler.stop() if profiler else None
    metrics_after = parse_metrics(operator.metrics())
    load.enter("between")
    per_job = [
        parse_time(j["status"]["allRunningTime"]) - parse_time(j["metadata"]["creationTimestamp"])
        for j in jobs
        if j.get("status", {}).get("allRunningTime")
    ]
    # Each job's creation and all-Running, in seconds after the apply started: where the tail is.
    timeline = sorted(
        [
            j["metadata"]["name"],
            round(parse_time(j["metadata"]["creationTimestamp"]) - started, 1),
            round(parse_time(j["status"]["allRunningTime"]) - started, 1),
        ]
        for j in jobs
        if j.get("status", {}).get("allRunningTime")
    )
    rounds = histogram_delta(
        metrics_before, metrics_after, "trainwave_placement_round_duration_seconds"
    )
    decisions = histogram_delta(
        metrics_before, metrics_after, "trainwave_placement_decision_seconds"
    )
    placed = delta(metrics_before, metrics_after, "trainwave_gangs_placed_total")
    at_creation = delta(metrics_before, metrics_after, "trainwave_gangs_placed_at_creation_total")
    requests = count_requests(audit_log, audit_offset, started, settled)
    writers = (
        writes_by_client(audit_log, audit_offset, started, last or settled) if AUDIT_ALL else None
    )
    worker = api.full(api.pods_path())[0]
    refusals = failed_scheduling(api)
    return {
        "jobs": JOBS,
        "pods": total,
        "apply_seconds": round(apply_seconds, 1),
        "all_running": all_running,
        "pods_running_at_end": running,
        "apply_to_all_running_seconds": round(last - started, 1) if last else None,
        "jobs_reporting_all_running": len(per_job),
        "job_all_running_seconds": quantiles(per_job),
        "placement_rounds": rounds,
        "placement_decisions": decisions,
        "gangs_placed": int(placed),
        "gangs_placed_at_creation": int(at_creation),
        "reconciles": int(delta(metrics_before, metrics_after, "trainwave_reconcile_duration_seconds_count")),
        "mean_reconcile_ms": mean_ms(metrics_before, metrics_after, "trainwave_reconcile_duration_seconds"),
        "operator_requests": requests,
        "operator_requests_per_placed_gang": round(requests["total"] / placed, 1) if placed else None,
        "failed_scheduling_events": refusals,
        "operator_peak_rss_mib": peak_rss_mib,
        "operator_cpu_seconds": process_cpu_seconds(pid),
        "operator_cpu_seconds_per_job": round(cpu.get("operator", 0.0) / JOBS, 3),
        "cpu_seconds_until_all_running": cpu,
        "writes_by_client_until_all_running": writers,
        "profile": profile,
        "job_timeline": timeline,
        "worker_pod": worker,
    }  # fmt: skip


def run_bare(
    cluster: Cluster, api: Api, worker: dict[str, Any], load: LoadSampler
) -> dict[str, Any]:
    total = JOBS * WORKERS
    pods = [bare_pod(worker, i) for i in range(total)]
    audit_log = Layout(cluster.state_dir).audit_log
    audit_offset = audit_log.stat().st_size if audit_log.exists() else 0
    load.enter("kube-scheduler")
    cpu_before = component_cpu(cluster)
    started = time.time()
    apply_seconds = apply(cluster, pods)
    print(f"applied {total} bare pods in {apply_seconds:.1f}s", flush=True)
    all_running, running = wait_running(api, total, started)
    cpu = cpu_delta(cpu_before, component_cpu(cluster))
    last = last_ready(api) if running else None
    writers = (
        writes_by_client(audit_log, audit_offset, started, last or time.time())
        if AUDIT_ALL
        else None
    )
    load.enter("between")
    return {
        "pods": total,
        "apply_seconds": round(apply_seconds, 1),
        "all_running": all_running,
        "pods_running_at_end": running,
        "apply_to_all_running_seconds": round(last - started, 1) if last else None,
        "cpu_seconds_until_all_running": cpu,
        "writes_by_client_until_all_running": writers,
        "pod_spec": pods[0]["spec"],
    }


def failed_scheduling(api: Api) -> dict[str, Any]:
    """kube-scheduler's FailedScheduling events in the namespace: how often it refused a
    released pod, and why (the most frequent messages)."""
    events = api.full(f"/api/v1/namespaces/{NAMESPACE}/events")
    why: Counter[str] = Counter()
    pods = set()
    for event in events:
        if event.get("reason") != "FailedScheduling":
            continue
        pods.add(event.get("involvedObject", {}).get("name", ""))
        series = event.get("series") or {}
        why[event.get("message", "")] += int(series.get("count") or event.get("count") or 1)
    return {"pods": len(pods), "events": sum(why.values()), "messages": dict(why.most_common(5))}


def bare_pod(worker: dict[str, Any], index: int) -> dict[str, Any]:
    """A plain Pod asking what phase A's worker asked: each container's resources and the
    pod's tolerations (nvidia.com/gpu limits, cpu and memory); no gate, no node choice."""
    spec = worker["spec"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"bare-{index:04d}", "namespace": NAMESPACE,
                     "labels": {BARE_LABEL: "1"}},
        "spec": {
            "containers": [
                {"name": c["name"], "image": "bench:1", "resources": c.get("resources", {})}
                for c in spec["containers"]
            ],
            "tolerations": spec.get("tolerations", []),
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
        },
    }  # fmt: skip


# kube-controller-manager's annotation on every node (ttl-controller) and its Event per new
# node (node-lifecycle-controller): the last writes a fresh cluster makes for its nodes.
NODE_TTL_ANNOTATION = "node.alpha.kubernetes.io/ttl"
SETTLE_TIMEOUT = 900.0
SETTLE_PAUSE = 5.0
# The controller manager's event broadcaster queues 1,000 Events and drops the rest: of
# 4,096 RegisteredNode Events 1,343 were written. Once the count has not moved this long,
# the rest were dropped, not delayed.
EVENTS_STALLED_SECONDS = 30.0


def settle(api: Api, nodes: int) -> float:
    """Wait until the controller manager of a cluster this run started has written what it
    writes once for each new node (about 2,000 node patches and 1,024 Events on large.yaml,
    some still to come when the cluster is ready); seconds waited. Phase B starts on a
    cluster that finished them long before; without the wait phase A would pay for them.
    (A reused cluster did all this when it started, and its Events may have expired.)"""
    started = time.monotonic()
    seen, moved = -1, started
    while time.monotonic() < started + SETTLE_TIMEOUT:
        registered = len(api.names("/api/v1/namespaces/default/events", "reason=RegisteredNode"))
        annotated = [
            n for n in api.metadata("/api/v1/nodes")
            if NODE_TTL_ANNOTATION in (n.get("annotations") or {})
        ]  # fmt: skip
        if registered != seen:
            seen, moved = registered, time.monotonic()
        stalled = time.monotonic() - moved > EVENTS_STALLED_SECONDS
        if len(annotated) >= nodes and (registered >= nodes or stalled):
            break
        time.sleep(POLL_SECONDS)
    time.sleep(SETTLE_PAUSE)  # the Events' own writes and the watchers catching up
    return time.monotonic() - started


def clear(cluster: Cluster, api: Api, load: LoadSampler) -> None:
    """Delete every job and pod of the namespace and wait until the pods are gone."""
    load.enter("cleanup")
    # One DELETE per collection first: kubectl deletes one object per request, and 8,000
    # pods took 13 minutes at load 12. kubectl then deletes whatever is left.
    immediately = {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0}
    for path in (f"/apis/trainwave.io/v1alpha1/namespaces/{NAMESPACE}/trainingjobs",
                 api.pods_path()):  # fmt: skip
        try:
            api.client.request("DELETE", path, immediately)
        except (ApiError, OSError) as error:
            print(f"delete collection {path}: {error}; kubectl deletes one by one", flush=True)
    cluster.kubectl("delete", "trainingjobs", "--all", "-n", NAMESPACE, "--wait=false",
                    check=False, timeout=300)  # fmt: skip
    cluster.kubectl("delete", "pods", "--all", "-n", NAMESPACE, "--wait=false",
                    "--grace-period=0", "--force", check=False, timeout=300)  # fmt: skip
    deadline = time.time() + 900
    while api.names(api.pods_path()) and time.time() < deadline:
        time.sleep(POLL_SECONDS)
    load.enter("between")


# --- the operator's metrics -------------------------------------------------------------


def parse_metrics(text: str) -> dict[str, float]:
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            try:
                values[name] = float(value)
            except ValueError:
                continue
    return values


def delta(before: dict[str, float], after: dict[str, float], name: str) -> float:
    return after.get(name, 0.0) - before.get(name, 0.0)


def mean_ms(before: dict[str, float], after: dict[str, float], name: str) -> float | None:
    count = delta(before, after, f"{name}_count")
    return round(1000 * delta(before, after, f"{name}_sum") / count, 1) if count else None


def histogram_delta(before: dict[str, float], after: dict[str, float], name: str) -> dict[str, Any]:
    """Count, mean, and p50/p99 interpolated linearly inside the histogram's buckets."""
    buckets = []
    for key, value in after.items():
        if key.startswith(f'{name}_bucket{{le="'):
            bound = key.split('le="', 1)[1].rstrip('"}')
            buckets.append((float(bound), value - before.get(key, 0.0)))
    buckets.sort()
    count = delta(before, after, f"{name}_count")
    if not count:
        return {"count": 0}
    total = delta(before, after, f"{name}_sum")
    return {
        "count": int(count),
        "mean_ms": round(1000 * total / count, 1),
        "p50_ms": bucket_quantile(buckets, 0.5),
        "p99_ms": bucket_quantile(buckets, 0.99),
        # Quantiles that fell past the last finite bucket: their value is only a lower bound.
        "lower_bounds": [
            name
            for name, q in (("p50_ms", 0.5), ("p99_ms", 0.99))
            if len(buckets) > 1 and buckets[-2][1] < q * buckets[-1][1]
        ],
        "source": "from histogram buckets (linear interpolation inside a bucket)",
        "buckets": {str(b): int(c) for b, c in buckets},
    }


def bucket_quantile(buckets: list[tuple[float, float]], q: float) -> float | None:
    """Prometheus' histogram_quantile on cumulative buckets, in ms."""
    total = buckets[-1][1]
    rank = q * total
    lower, below = 0.0, 0.0
    for bound, cumulative in buckets:
        if cumulative >= rank:
            if bound == float("inf"):
                return round(1000 * lower, 1)  # past the last finite bucket: a lower bound
            inside = cumulative - below
            share = (rank - below) / inside if inside else 1.0
            return round(1000 * (lower + (bound - lower) * share), 1)
        lower, below = bound, cumulative
    return None


# --- the operator's process and requests -------------------------------------------------


def vm_hwm_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return None


def component_cpu(cluster: Cluster, operator_pid: int | None = None) -> dict[str, float]:
    """CPU seconds (user + system) each control-plane process and the operator used so far:
    two readings around a phase say which process the machine's 2 cores went to."""
    state = json.loads(Layout(cluster.state_dir).state_file.read_text())
    pids = {p["name"]: p["pid"] for p in state["processes"]}
    if operator_pid is not None:
        pids["operator"] = operator_pid
    return {
        name: seconds
        for name, pid in pids.items()
        if (seconds := process_cpu_seconds(pid)) is not None
    }


def cpu_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    spent = {name: round(after[name] - before.get(name, 0.0), 1) for name in after}
    return spent | {"total": round(sum(spent.values()), 1)}


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process (the operator, a control-plane part) since it
    started."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    return round((int(fields[11]) + int(fields[12])) / ticks, 1)


def audit_events(audit_log: Path, offset: int, since: float, until: float) -> Iterator[Any]:
    """The audit log's events after `offset` whose request was received in [since, until]."""
    if not audit_log.exists():
        return
    with audit_log.open() as log:
        log.seek(offset)
        for line in log:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if since <= parse_time(event["requestReceivedTimestamp"]) <= until:
                yield event


def request_kind(event: Any) -> str:
    """One audit event as `verb resource[/subresource]`."""
    ref = event.get("objectRef", {})
    resource = ref.get("resource", event.get("requestURI", "?"))
    if ref.get("subresource"):
        resource += "/" + ref["subresource"]
    return f"{event['verb']} {resource}"


def count_requests(audit_log: Path, offset: int, since: float, until: float) -> dict[str, Any]:
    """The operator's non-watch requests received in [since, until], from the audit log,
    by verb and resource (subresource after a slash)."""
    kinds: Counter[str] = Counter()
    watches = 0
    for event in audit_events(audit_log, offset, since, until):
        if event.get("user", {}).get("username") != OPERATOR_USER:
            continue
        if event["verb"] == "watch":
            watches += 1
        else:
            kinds[request_kind(event)] += 1
    return {
        "total": sum(kinds.values()),
        "by_verb_and_resource": dict(kinds.most_common()),
        "watches_started": watches,
        "window_seconds": round(until - since, 1),
        "source": f"kube-apiserver audit log, level Metadata, user {OPERATOR_USER} only",
    }


def writes_by_client(audit_log: Path, offset: int, since: float, until: float) -> dict[str, Any]:
    """Every client's writes (not get, list or watch) received in [since, until], by user and
    then by verb and resource: what the API server was asked to do in a phase."""
    users: dict[str, Counter[str]] = {}
    for event in audit_events(audit_log, offset, since, until):
        if event.get("verb") not in ("get", "list", "watch"):
            user = event.get("user", {}).get("username", "?")
            users.setdefault(user, Counter())[request_kind(event)] += 1
    ranked = sorted(users.items(), key=lambda item: -sum(item[1].values()))
    return {
        "total": sum(sum(c.values()) for c in users.values()),
        "by_client": {
            user: {"total": sum(c.values()), **dict(c.most_common())} for user, c in ranked
        },
    }


class Profiler:
    """py-spy sampling the running operator: only the thread holding the GIL, so samples are
    Python CPU time, not threads waiting on a socket."""

    def __init__(self, pid: int, output: Path) -> None:
        self.output = output
        binary = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        self.process: subprocess.Popen[bytes] | None = None
        if not os.access(binary, os.X_OK):
            return
        self.process = subprocess.Popen(
            [binary, "record", "--pid", str(pid), "--rate", str(PROFILE_RATE), "--nonblocking",
             "--gil", "--format", "raw", "--output", str(output)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip

    def stop(self) -> dict[str, Any] | None:
        if self.process is None:
            return None
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
        return summarize_profile(self.output)


# Frames on (nearly) every stack: the event loop, threads, the entry point. Left out of the
# report's cumulative table (kept in the JSON).
PLUMBING = ("asyncio/", "runpy>", "threading.py", "concurrent/futures/", "trainwave/cli/")


def summarize_profile(path: Path, top: int = 40) -> dict[str, Any] | None:
    """From py-spy's collapsed stacks: the functions with the most samples anywhere on the
    stack (cumulative) and at its top (self), as shares of all samples (GIL held)."""
    if not path.exists():
        return None
    cumulative: Counter[str] = Counter()
    own: Counter[str] = Counter()
    samples = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        samples += count
        # "function (file.py:123)": one entry per function, whatever the line.
        frames = [re.sub(r":\d+\)$", ")", f) for f in stack.split(";")]
        for frame in set(frames):
            cumulative[frame] += count
        own[frames[-1]] += count
    if not samples:
        return {"samples": 0}

    def share(counter: Counter[str]) -> list[list[Any]]:
        return [[frame, round(n / samples, 3)] for frame, n in counter.most_common(top)]

    return {
        "samples": samples,
        "rate_per_second": PROFILE_RATE,
        "top_cumulative": share(cumulative),
        "top_self": share(own),
        "raw": str(path),
    }


# --- results -------------------------------------------------------------------------------


def quantiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    return {
        "p50": round(statistics.median(values), 1),
        "p99": round(percentile(values, 0.99), 1),
        "max": round(max(values), 1),
    }


def summarize(
    a: dict[str, Any], b: dict[str, Any], nodes: int, load: LoadSampler, seconds: float
) -> dict[str, Any]:
    worker = a.pop("worker_pod")
    resources = {c["name"]: c.get("resources", {}) for c in worker["spec"]["containers"]}
    ratio = (
        round(a["apply_to_all_running_seconds"] / b["apply_to_all_running_seconds"], 2)
        if a["apply_to_all_running_seconds"] and b["apply_to_all_running_seconds"]
        else None
    )
    rounds = a["placement_rounds"]
    figures = {
        "trainwave_over_bare": ratio,
        "job_p99_seconds": a["job_all_running_seconds"].get("p99"),
        "round_p99_seconds": rounds["p99_ms"] / 1000 if rounds.get("p99_ms") else None,
        "peak_rss_mib": a["operator_peak_rss_mib"],
    }
    goals = {
        name: {
            "goal": f"<= {GOALS[name]}" if name != "round_p99_seconds" else f"< {GOALS[name]}",
            "measured": value,
            "met": value is not None
            and (value < GOALS[name] if name == "round_p99_seconds" else value <= GOALS[name]),
        }
        for name, value in figures.items()
    }
    return {
        "smoke": SMOKE,
        "goals": goals,
        "trainwave": a,
        "bare_pods": b,
        "conditions": {
            "date": time.strftime("%Y-%m-%d %H:%M %Z"),
            "commit": git_commit(),
            "topology": f"{TOPOLOGY.relative_to(REPO)}: {nodes} nodes x 8 GPUs",
            "job_shape": f"{JOBS} TrainingJobs x {WORKERS} workers x {GPUS} GPU, never finishing",
            "worker_resources": resources,
            "worker_tolerations": worker["spec"].get("tolerations", []),
            "apply": "one `kubectl apply --server-side` per phase (serial PATCH per object)",
            "operator": f"1 process, {OPERATOR_WORKERS or 'default (4)'} reconcile workers, "
            "as the chart's ServiceAccount; "
            + (f"py-spy sampling it at {PROFILE_RATE}/s during phase A" if a["profile"]
               else "not profiled"),
            "requests": "kube-apiserver audit log (Metadata) of "
                        + ("every client (BENCH_AUDIT_ALL; the operator's requests are counted "
                           "from it alone)" if AUDIT_ALL else "the operator's ServiceAccount only")
                        + ", phase A from apply start until every job reported allRunningTime",
            "control_plane": "kube-apiserver/scheduler/controller-manager v1.34.4, etcd 3.5.1, "
                             "kwok v0.8.0; kwok marks bound pods Running at once",
            "machine": f"{os.cpu_count()} cores, {platform.machine()}, "
                       f"Python {platform.python_version()}; shared with other engineers' tests",
            "load_average_1m": {
                "before": load.samples[0][1] if load.samples else None,
                "trainwave": load.during("trainwave"),
                "kube_scheduler": load.during("kube-scheduler"),
                "jobs_alone": load.during("jobs-alone"),
            },
            "run_seconds": round(seconds, 1),
            "kernel": platform.release(),
        },
    }  # fmt: skip


def report(result: dict[str, Any]) -> str:
    a, b, c = result["trainwave"], result["bare_pods"], result["conditions"]
    rounds = a["placement_rounds"]
    decisions = a.get("placement_decisions") or {}
    goals = "\n".join(
        f"| {name} | {g['goal']} | {g['measured']} | {'met' if g['met'] else 'MISSED'} |"
        for name, g in result["goals"].items()
    )
    requests = a["operator_requests"]
    by_kind = "\n".join(f"  - {k}: {v}" for k, v in requests["by_verb_and_resource"].items())
    profile = a.get("profile") or {}
    top = "\n".join(
        f"| {frame} | {share:.1%} |"
        for frame, share in profile.get("top_cumulative", [])
        if not any(plumbing in frame for plumbing in PLUMBING)
    )
    top_self = "\n".join(
        f"| {frame} | {share:.1%} |" for frame, share in profile.get("top_self", [])[:12]
    )
    if profile.get("samples"):
        profile_text = f"""Profile of the operator in phase A (py-spy --gil: {profile["samples"]} samples, each taken
while a thread held the GIL, i.e. Python CPU time); share of samples with the function anywhere
on the stack:

| function | cumulative |
|---|---|
{top}

At the top of the stack (self):

| function | self |
|---|---|
{top_self}"""
    else:
        profile_text = "The operator was not profiled in this run."
    slowest = sorted(a.get("job_timeline", []), key=lambda t: t[2] - t[1])[-5:]
    tail = ", ".join(f"{n} (created +{c} s, all Running +{r} s)" for n, c, r in reversed(slowest))
    jobs = a["job_all_running_seconds"]
    conditions = "\n".join(f"- {k}: {v}" for k, v in c.items())
    title = "Scale benchmark" + (" (smoke run)" if result["smoke"] else "")
    return f"""# {title}: {c["job_shape"]} on {c["topology"]}

| figure | goal | measured | |
|---|---|---|---|
{goals}

Phase A, trainwave:

- started {a.get("settle_seconds", "?")} s after the cluster was ready: once the controller manager had annotated every node and posted its RegisteredNode Events (0: a cluster that was already up)
- `kubectl apply --server-side` of {a["jobs"]} jobs: {a["apply_seconds"]} s
- apply start -> all {a["pods"]} workers Running: {a["apply_to_all_running_seconds"]} s (all Running: {a["all_running"]})
- per job, created -> all workers Running: p50 {jobs.get("p50")} / p99 {jobs.get("p99")} / max {jobs.get("max")} s ({a["jobs_reporting_all_running"]} jobs reported)
- placement rounds: {rounds.get("count")}, mean {rounds.get("mean_ms")} ms, p50 {rounds.get("p50_ms")} / p99 {">" if "p99_ms" in rounds.get("lower_bounds", []) else ""}{rounds.get("p99_ms")} ms (from histogram buckets; read the cache, decide, release the admitted gangs)
- of which the decision (snapshot + plan_round, no API calls): mean {decisions.get("mean_ms")} ms, p50 {decisions.get("p50_ms")} / p99 {">" if "p99_ms" in decisions.get("lower_bounds", []) else ""}{decisions.get("p99_ms")} ms
- gangs placed: {a["gangs_placed"]} ({a.get("gangs_placed_at_creation", 0)} created placed, the rest released from the gate); reconciles: {a["reconciles"]} (mean {a["mean_reconcile_ms"]} ms)
- operator API requests (audit log, watches excluded): {requests["total"]} in {requests["window_seconds"]} s, {a["operator_requests_per_placed_gang"]} per placed gang; {requests["watches_started"]} watches started:
{by_kind}
- kube-scheduler FailedScheduling in phase A: {a.get("failed_scheduling_events", "not recorded")}
- slowest jobs, times after the apply started: {tail or "not recorded"}
- operator peak RSS (VmHWM): {a["operator_peak_rss_mib"]} MiB; operator CPU since its start: {a["operator_cpu_seconds"]} s; apply start -> all Running: {a.get("operator_cpu_seconds_per_job")} s per job
- CPU seconds per process, apply start -> all Running: {a.get("cpu_seconds_until_all_running")}
- writes by client, apply start -> all Running (BENCH_AUDIT_ALL): {a.get("writes_by_client_until_all_running")}

Phase B, bare pods bound by kube-scheduler (operator stopped):

- `kubectl apply --server-side` of {b["pods"]} pods: {b["apply_seconds"]} s
- apply start -> all {b["pods"]} pods Running: {b["apply_to_all_running_seconds"]} s (all Running: {b["all_running"]})
- CPU seconds per process, apply start -> all Running: {b.get("cpu_seconds_until_all_running")}
- writes by client, apply start -> all Running (BENCH_AUDIT_ALL): {b.get("writes_by_client_until_all_running")}

Phase C, the same TrainingJobs with the operator stopped (nothing acts on them):

- `kubectl apply --server-side` of {a["jobs"]} jobs: {b.get("jobs_alone_apply_seconds")} s

{profile_text}

Conditions:
{conditions}
"""


if __name__ == "__main__":
    sys.exit(main())
