"""Benchmark: jobs outside Kueue in a cluster running Kueue, whose release registers a
mutating webhook for every pod create (`mpod.kb.io`). Same cluster, same run, same jobs
(bench_scale's: BENCH_JOBS TrainingJobs of 4 workers x 1 GPU on the 1,024-node topology,
applied at once, never finishing), three phases, each measured as bench_scale's phase A:

1. no-webhook: Kueue not running, no pod webhook: every gang that fits is created placed;
2. dry-run: Kueue v0.17.0 with its webhooks (tests/cluster/kueue.py): each gang's first
   placed pod is created as a dry run first, then the gang placed (controller/executing.py);
3. gated: the same, plus a LimitRange in the namespace that changes no pod (a maximum for
   claims): every gang is created behind the gate and released, the path every job
   took past a pod webhook before the dry run (admission_guards.py), for the same cause.

Reported per phase: apply -> all workers Running, per-job p50/p99, gangs created placed,
dry runs, the operator's requests per gang (audit log) and CPU seconds per job.
Results: tests/benchmarks/results/pod-webhook[-BENCH_TAG].{json,md}.
Reproduce: `make bench-pod-webhook` (about 7 minutes here; no root; BENCH_OPERATOR_WORKERS=N sets
the operator's --workers and names the results pod-webhook-workersN).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))

from benchmarks.bench_scale import Api, clear, run_trainwave, settle  # noqa: E402
from benchmarks.operator_cluster import operator_cluster  # noqa: E402
from benchmarks.provenance import write_results  # noqa: E402
from benchmarks.scale_measures import OPERATOR_USER, LoadSampler, delta, parse_metrics  # noqa: E402
from benchmarks.scale_settings import (  # noqa: E402
    CLUSTER_TIMEOUT,
    JOBS,
    KEEP_CLUSTER,
    NAMESPACE,
    OPERATOR_WORKERS,
    STATE_NAME,
    TOPOLOGY,
    results_stem,
)
from cluster.kueue import start_kueue  # noqa: E402

RESULTS = results_stem("pod-webhook")
NO_OP_LIMITS = {
    "apiVersion": "v1",
    "kind": "LimitRange",
    "metadata": {"name": "no-op", "namespace": NAMESPACE},
    # For claims: LimitRanger leaves pods alone (a Container maximum would become their
    # default limit and request), while any LimitRange in the namespace gates every gang.
    "spec": {"limits": [{"type": "PersistentVolumeClaim", "max": {"storage": "1Ti"}}]},
}
KEPT = (
    "apply_to_all_running_seconds",
    "job_all_running_seconds",
    "gangs_placed",
    "gangs_placed_at_creation",
    "operator_requests_per_placed_gang",
    "operator_cpu_seconds_per_job",
    "mean_reconcile_ms",
    "pods_running_at_end",
)


def main() -> int:
    load = LoadSampler()
    load.start()
    phases: dict[str, dict[str, Any]] = {}
    with operator_cluster(
        TOPOLOGY,
        STATE_NAME,
        NAMESPACE,
        audit_users=[OPERATOR_USER],
        keep_cluster=KEEP_CLUSTER,
        operator_args=("--workers", OPERATOR_WORKERS) if OPERATOR_WORKERS else (),
        cluster_timeout=CLUSTER_TIMEOUT,
    ) as bench:
        cluster = bench.cluster
        api = Api(cluster)
        if cluster.started:
            settle(api, len(api.names("/api/v1/nodes")))
        phases["no-webhook"] = measured(bench, api, load)
        clear(cluster, api, load)
        kueue = start_kueue(cluster, bench.workdir / "kueue")
        try:
            time.sleep(2)  # the operator's watch of webhook configurations
            phases["dry-run"] = measured(bench, api, load)
            clear(cluster, api, load)
            cluster.kubectl("apply", "-f", "-", input=json.dumps(NO_OP_LIMITS))
            time.sleep(2)  # its LimitRange watch
            phases["gated"] = measured(bench, api, load)
            clear(cluster, api, load)
            cluster.kubectl("delete", "limitrange", "no-op", "-n", NAMESPACE, check=False)
        finally:
            kueue.stop()
    workers = int(OPERATOR_WORKERS or 8)  # the operator's default
    result = {
        "jobs": JOBS,
        "topology": TOPOLOGY.stem,
        "reconcile_workers": workers,
        "phases": phases,
    }
    write_results(RESULTS, result, report(result))
    print(report(result))
    return 0


def measured(bench: Any, api: Api, load: LoadSampler) -> dict[str, Any]:
    before = parse_metrics(bench.operator.metrics())
    phase = run_trainwave(bench.cluster, bench.operator, api, bench.workdir, load)
    after = parse_metrics(bench.operator.metrics())
    kept = {key: phase[key] for key in KEPT}
    for result in ("unchanged", "changed", "failed"):
        name = f'trainwave_creation_dry_runs_total{{result="{result}"}}'
        kept[f"dry_runs_{result}"] = int(delta(before, after, name))
    # run_trainwave tags its samples "trainwave": each phase's own, then dropped for the next
    kept["load"] = load.during("trainwave")
    load.samples[:] = [s for s in load.samples if s[0] != "trainwave"]
    print(json.dumps(kept), flush=True)
    return kept


def report(result: dict[str, Any]) -> str:
    lines = [
        f"# Jobs outside Kueue past Kueue's pod webhook: {result['jobs']} jobs x 4 workers, "
        f"{result['topology']}, {result['reconcile_workers']} reconcile workers",
        "",
        "| phase | apply -> all Running (s) | per job p50 / p99 (s) | placed at creation "
        "| dry runs (unchanged / changed / failed) | operator requests per gang "
        "| operator CPU per job (s) | 1-min load mean / max |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, p in result["phases"].items():
        q = p["job_all_running_seconds"] or {}
        lines.append(
            f"| {name} | {p['apply_to_all_running_seconds']} | {q.get('p50')} / {q.get('p99')} "
            f"| {p['gangs_placed_at_creation']} of {p['gangs_placed']} "
            f"| {p['dry_runs_unchanged']} / {p['dry_runs_changed']} / {p['dry_runs_failed']} "
            f"| {p['operator_requests_per_placed_gang']} | {p['operator_cpu_seconds_per_job']} "
            f"| {p['load'].get('mean')} / {p['load'].get('max')} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
