"""Benchmark: 500 TrainingJobs x 4 workers on 1,024 nodes (or 2,000 on 4,096), against
kube-scheduler's own limit.

Runs on its own local cluster (tests/cluster/topologies/large.yaml: 1,024 nodes x 8 GPUs;
xlarge.yaml: 4,096) in its own state directory, with the chart installed, the operator
running as its ServiceAccount, and the API server writing an audit log of that
ServiceAccount's requests (level Metadata; nothing else is audited). One run, three phases, the first started once
the controller manager has finished the writes it makes once for each new node (as phase B
starts on a cluster that finished them long before). Between phases everything the last one
made is deleted (its jobs' Services and EndpointSlices too, which the garbage collector
deletes after the jobs), and each phase starts once the control plane's CPU is back to its
idle level (scale_measures.QuietGate; the wait is in the results):

A. trainwave: one `kubectl apply --server-side` of BENCH_JOBS TrainingJobs of 4 workers x
   BENCH_GPUS GPUs that never finish. Measured: apply start -> last of the workers Running
   (read from the pods' Ready conditions), per job creationTimestamp -> status.allRunningTime,
   placement rounds (from the operator's histogram: count, mean, p50/p99 interpolated from
   its buckets), the operator's API requests (from the audit log, watches excluded) per
   placed gang, the operator's peak RSS (VmHWM), the CPU seconds each control-plane
   process and the operator used until all were Running, where each job's seconds went
   (scale_stages.py on the operator's log: its share, then binding and kwok's, and the five
   slowest jobs' split), and optionally a py-spy profile.
B. everything deleted, the operator stopped; the same number of bare Pods with the requests
   phase A's workers got (no gate, no operator) in one `kubectl apply --server-side`;
   kube-scheduler binds them. Measured: apply start -> last pod Running, the control plane's
   own limit on this machine, and the CPU seconds per process as in A (both phases keep
   the 2 cores busy, so the ratio of A to B follows the ratio of CPU they need).
B2. (BENCH_BARE_AS_WORKERS=1, the default) everything deleted; phase A's worker pods once
   more, as the operator wrote them (labels, annotations, environment, hostname) but without
   owner, node pin or gate, bound by kube-scheduler: B's pods are a few hundred bytes, the
   workers a few kilobytes, and kube-apiserver, etcd and kwok carry every byte; B2 tells
   what the workers' content costs from what the operator costs.
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
BENCH_OPERATOR_WORKERS (the operator's --workers; default its own, 8), BENCH_TAG (appended
to the results' name, for repeats), BENCH_AUDIT_ALL (0; 1 audits every client, not only the
operator, and reports each phase's writes by client: a diagnostic, auditing costs CPU).
"""

from __future__ import annotations

import copy
import json
import sys
import time
from collections import Counter
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import quote

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))

import yaml  # noqa: E402

from benchmarks.operator_cluster import operator_cluster, parse_time  # noqa: E402
from benchmarks.provenance import write_results  # noqa: E402
from benchmarks.scale_measures import (  # noqa: E402
    OPERATOR_USER,
    LoadSampler,
    Profiler,
    QuietGate,
    cluster_cpu_seconds,
    component_cpu,
    count_requests,
    cpu_delta,
    delta,
    histogram_delta,
    machine_seconds,
    mean_ms,
    parse_metrics,
    process_cpu_seconds,
    vm_hwm_mib,
    writes_by_client,
)
from benchmarks.scale_report import quantiles, report, summarize  # noqa: E402
from benchmarks.scale_settings import (  # noqa: E402
    AUDIT_ALL,
    BARE_AS_WORKERS,
    BARE_LABEL,
    CLUSTER_TIMEOUT,
    GPUS,
    JOBS,
    KEEP_CLUSTER,
    NAMESPACE,
    OPERATOR_WORKERS,
    PHASE_TIMEOUT,
    POLL_SECONDS,
    PROFILE,
    RESULTS,
    STATE_NAME,
    TOPOLOGY,
    WORKERS,
)
from benchmarks.scale_stages import stages  # noqa: E402
from cluster.api import ApiClient, ApiError  # noqa: E402
from cluster.components import Layout  # noqa: E402
from cluster.controlplane import Cluster  # noqa: E402
from cluster.deploy import OperatorProcess  # noqa: E402


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
        gate = QuietGate(cluster_cpu_seconds(bench.cluster))
        quiet = quiet_for(gate, "trainwave")
        phase_a = run_trainwave(bench.cluster, bench.operator, api, bench.workdir, load)
        phase_a["quiet_before"] = quiet
        print(json.dumps({k: v for k, v in phase_a.items() if k != "worker_pod"}), flush=True)
        clear(bench.cluster, api, load)
        bench.operator.stop()
        quiet = quiet_for(gate, "bare pods")
        phase_b = run_bare(bench.cluster, api, phase_a["worker_pod"], load, bare_pod)
        phase_b["quiet_before"] = quiet
        print(json.dumps(phase_b), flush=True)
        clear(bench.cluster, api, load)
        if BARE_AS_WORKERS:
            quiet = quiet_for(gate, "the workers' own pods")
            as_workers = run_bare(bench.cluster, api, phase_a["worker_pod"], load, worker_copy)
            as_workers["quiet_before"] = quiet
            phase_b["as_workers"] = as_workers
            print(json.dumps(as_workers), flush=True)
            clear(bench.cluster, api, load)
        quiet_for(gate, "jobs alone")
        load.enter("jobs-alone")
        phase_b["jobs_alone_apply_seconds"] = round(apply(bench.cluster, job_manifests()), 1)
        print(f"applied {JOBS} jobs, operator stopped, in {phase_b['jobs_alone_apply_seconds']}s")
        clear(bench.cluster, api, load)
    phase_a["settle_seconds"] = round(settled_after, 1)
    result = summarize(phase_a, phase_b, nodes, load, time.monotonic() - started)
    write_results(RESULTS, result, report(result))
    print(report(result))
    return 0


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
    applied = cluster.kubectl(
        "apply", "--server-side", "--field-manager=bench-scale", "-n", NAMESPACE, "-f", "-",
        input=yaml.safe_dump_all(objects), timeout=1200, check=False,
    )  # fmt: skip
    if applied.returncode != 0:
        raise RuntimeError(f"kubectl apply failed: {applied.stderr.strip()[-2000:]}")
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
        "stages": stages_of(timeline, workdir / "operator.log", started, settled),
        "worker_pod": worker,
    }  # fmt: skip


def stages_of(
    timeline: list[list[Any]], log: Path, started: float, settled: float
) -> dict[str, Any]:
    """Where each job's seconds went, from the operator's log of this phase (scale_stages.py):
    created -> placed is the operator's, placed -> all Running binding's and kwok's."""
    if not log.exists():
        return {}
    clock = partial(time.strftime, "%H:%M:%S")
    since, until = clock(time.localtime(started - 1)), clock(time.localtime(settled + 1))
    return stages({"trainwave": {"job_timeline": timeline}}, log, since, until)


def run_bare(
    cluster: Cluster,
    api: Api,
    worker: dict[str, Any],
    load: LoadSampler,
    make: Callable[[dict[str, Any], int], dict[str, Any]],
) -> dict[str, Any]:
    total = JOBS * WORKERS
    pods = [make(worker, i) for i in range(total)]
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


# What the API server fills in or the operator chose per gang: left out of a worker's copy.
_SERVER_FIELDS = ("uid", "resourceVersion", "creationTimestamp", "generation", "managedFields")
_CHOSEN_FIELDS = ("nodeName", "affinity", "schedulingGates", "priority", "serviceAccount")


def worker_copy(worker: dict[str, Any], index: int) -> dict[str, Any]:
    """Phase A's worker pod as the operator wrote it (labels, annotations, environment,
    hostname, every container), without its owner, its node pin or its gate: the same
    bytes for kube-apiserver, etcd and kwok to carry, bound by kube-scheduler. Against
    `bare_pod`, it tells what the pods' content costs from what the operator costs."""
    pod = {**copy.deepcopy(worker), "apiVersion": "v1", "kind": "Pod"}  # a list's item lacks them
    pod.pop("status", None)
    meta = pod["metadata"]
    for name in (*_SERVER_FIELDS, "ownerReferences"):  # the job is gone: GC would take them
        meta.pop(name, None)
    meta["name"] = f"bare-{index:04d}"
    meta["labels"] = {**meta.get("labels", {}), BARE_LABEL: "1"}
    for name in _CHOSEN_FIELDS:
        pod["spec"].pop(name, None)
    return pod


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


DELETE_COLLECTION_TRIES = 10


def quiet_for(gate: QuietGate, phase: str) -> dict[str, Any]:
    """Wait for the control plane to go quiet before `phase`; what the wait saw, and how
    fast the machine was then."""
    quiet = gate.wait() | {"machine_seconds": machine_seconds()}
    said = "quiet" if quiet["quiet"] else "NOT quiet, starting anyway"
    print(f"before {phase}: {said} after {quiet['seconds']}s, cores {quiet['cores_per_window']}, "
          f"machine {quiet['machine_seconds']}s", flush=True)  # fmt: skip
    return quiet


def clear(cluster: Cluster, api: Api, load: LoadSampler) -> None:
    """Delete every job and pod of the namespace and wait until they and the jobs' Services
    and EndpointSlices are gone."""
    load.enter("cleanup")
    # One DELETE per collection first: kubectl deletes one object per request, and 8,000
    # pods took 13 minutes at load 12. kube-apiserver ends a request after 60 s (HTTP 504)
    # and keeps what it deleted by then, so a collection too large for one is asked again
    # while it shrinks. kubectl then deletes whatever is left.
    immediately = {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0}
    for path in (f"/apis/trainwave.io/v1alpha1/namespaces/{NAMESPACE}/trainingjobs",
                 api.pods_path()):  # fmt: skip
        left = len(api.names(path))
        for _ in range(DELETE_COLLECTION_TRIES):
            try:
                api.client.request("DELETE", path, immediately)
                break
            except (ApiError, OSError) as error:
                before, left = left, len(api.names(path))
                print(f"delete collection {path}: {error}; {left} left", flush=True)
                if left >= before:
                    break  # no progress: kubectl deletes one by one
    cluster.kubectl("delete", "trainingjobs", "--all", "-n", NAMESPACE, "--wait=false",
                    check=False, timeout=300)  # fmt: skip
    cluster.kubectl("delete", "pods", "--all", "-n", NAMESPACE, "--wait=false",
                    "--grace-period=0", "--force", check=False, timeout=300)  # fmt: skip
    # The jobs' Services and their EndpointSlices go with them through the garbage
    # collector, after the jobs: wait for those too, or the next phase pays for them.
    left = (api.pods_path(), f"/api/v1/namespaces/{NAMESPACE}/services",
            f"/apis/discovery.k8s.io/v1/namespaces/{NAMESPACE}/endpointslices")  # fmt: skip
    deadline = time.time() + 900
    while any(api.names(path) for path in left) and time.time() < deadline:
        time.sleep(POLL_SECONDS)
    load.enter("between")


if __name__ == "__main__":
    sys.exit(main())
