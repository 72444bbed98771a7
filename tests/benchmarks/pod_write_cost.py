"""Diagnostic: what creating one worker pod costs kube-apiserver, by how it is written.

At 2,000 jobs on 4,096 nodes (bench_scale.py, `xlarge`) `kubectl apply` of the jobs is the
long pole, slowed by everything else the API server serves meanwhile; the operator's 8,000
pod writes are the largest share of that. The operator used to write its pods with
server-side apply (PATCH, `application/apply-patch+yaml`, force); the Job and ReplicaSet
controllers create theirs with POST, as the operator now does, with fieldValidation=Strict
(controller/kube.py KubeClient.create_pod). This measures the three on their own small
cluster (tests/cluster/topologies/small.yaml, its own state directory), with nothing else
writing: PODS worker pods as the operator builds them for the scale benchmark's job (4
workers x 1 GPU, no runtime section, behind the scheduling gate, so nothing else touches
them), one request after another, per variant; then the pods are deleted and the next
variant runs. Variants alternate over ROUNDS, so a change of the machine's load shows as
spread within a variant. Measured: kube-apiserver CPU seconds (user + system, /proc) and
wall time, per pod.

A diagnostic: `make bench-pod-cost`, not part of `make bench`. Environment:
POD_COST_PODS (400), POD_COST_ROUNDS (3), BENCH_KEEP_CLUSTER (0).
Writes tests/benchmarks/results/pod_write_cost.{json,md}.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "operator"))

from benchmarks.apiserver_cluster import (  # noqa: E402
    apiserver_cluster,
    common_conditions,
    conditions_lines,
)
from benchmarks.provenance import write_results  # noqa: E402
from benchmarks.scale_measures import process_cpu_seconds  # noqa: E402
from cluster.api import ApiClient  # noqa: E402
from trainwave import contract  # noqa: E402
from trainwave.api.trainingjob import parse_trainingjob  # noqa: E402
from trainwave.builders.pods import build_worker_pods  # noqa: E402
from trainwave.resolving import resolve_job  # noqa: E402

STATE_DIR = Path.home() / ".cache" / "trainwave" / "bench-pod-cost"
RESULTS = REPO / "tests" / "benchmarks" / "results" / "pod_write_cost"
PODS = int(os.environ.get("POD_COST_PODS", "400"))
ROUNDS = int(os.environ.get("POD_COST_ROUNDS", "3"))
KEEP_CLUSTER = os.environ.get("BENCH_KEEP_CLUSTER", "0") == "1"
NAMESPACE = "pod-cost"
PODS_PATH = f"/api/v1/namespaces/{NAMESPACE}/pods"
APPLY = "application/apply-patch+yaml"
LABEL = "pod-cost.trainwave.io/variant"


def worker_pods(count: int) -> list[dict[str, Any]]:
    """`count` worker pods as the operator builds them: the scale benchmark's job (4 x 1 GPU,
    no runtime section), each job under its own name and UID."""
    pods = []
    for index in range(0, count, 4):
        body = {
            "apiVersion": contract.API_VERSION,
            "kind": contract.KIND,
            "metadata": {"name": f"cost-{index // 4:04d}", "namespace": NAMESPACE,
                         "uid": f"00000000-0000-4000-8000-{index // 4:012d}", "generation": 1},
            "spec": {"workers": 4, "gpusPerWorker": 1, "image": "bench:1"},
        }  # fmt: skip
        resolved = resolve_job(parse_trainingjob(body))
        pods += build_worker_pods(resolved, (0, 1, 2, 3), 0)
    return pods[:count]


def by_apply(api: ApiClient, pod: dict[str, Any]) -> None:
    """As the operator wrote its pods until 1446cad."""
    name = pod["metadata"]["name"]
    query = f"fieldManager={contract.FIELD_MANAGER}&force=true"
    api.request("PATCH", f"{PODS_PATH}/{name}?{query}", pod, APPLY)


def by_create(api: ApiClient, pod: dict[str, Any]) -> None:
    """The API server's default field validation (Warn)."""
    api.request("POST", f"{PODS_PATH}?fieldManager={contract.FIELD_MANAGER}", pod)


def by_strict_create(api: ApiClient, pod: dict[str, Any]) -> None:
    """As the operator writes its pods (controller/kube.py KubeClient.create_pod)."""
    query = f"fieldManager={contract.FIELD_MANAGER}&fieldValidation=Strict"
    api.request("POST", f"{PODS_PATH}?{query}", pod)


VARIANTS: dict[str, Callable[[ApiClient, dict[str, Any]], None]] = {
    "server-side apply": by_apply,
    "create (POST)": by_create,
    "create, fieldValidation=Strict": by_strict_create,
}


def write_cost(
    api: ApiClient, apiserver_pid: int, label: str, pods: list[dict[str, Any]]
) -> tuple[float, float]:
    """(ms of kube-apiserver CPU, ms of wall time) per pod written by `label`."""
    write = VARIANTS[label]
    marked = [{**p, "metadata": {**p["metadata"], "labels": {
        **p["metadata"].get("labels", {}), LABEL: "x"}}} for p in pods]  # fmt: skip
    time.sleep(1)  # the last deletion's echoes out of the window
    before, started = process_cpu_seconds(apiserver_pid), time.perf_counter()
    for pod in marked:
        write(api, pod)
    wall = time.perf_counter() - started
    after = process_cpu_seconds(apiserver_pid)
    delete_all(api)
    if before is None or after is None:
        raise RuntimeError("kube-apiserver went away during the writes")
    return (after - before) / len(pods) * 1000, wall / len(pods) * 1000


def delete_all(api: ApiClient) -> None:
    # Gated pods on no node: the API server deletes them at once (no kubelet to wait for).
    api.request("DELETE", f"{PODS_PATH}?labelSelector={LABEL}&gracePeriodSeconds=0")
    deadline = time.monotonic() + 120
    while api.get(f"{PODS_PATH}?labelSelector={LABEL}&limit=1")["items"]:
        if time.monotonic() > deadline:
            raise RuntimeError("pods not deleted within 120 s")
        time.sleep(0.5)


def run() -> dict[str, Any]:
    pods = worker_pods(PODS)
    size = statistics.mean(len(json.dumps(p)) for p in pods)
    cpu: dict[str, list[float]] = {}
    wall: dict[str, list[float]] = {}
    with apiserver_cluster(STATE_DIR, NAMESPACE, keep=KEEP_CLUSTER) as (api, apiserver):
        delete_all(api)
        for round_ in range(ROUNDS):
            for label in VARIANTS:
                cpu_ms, wall_ms = write_cost(api, apiserver, label, pods)
                cpu.setdefault(label, []).append(round(cpu_ms, 2))
                wall.setdefault(label, []).append(round(wall_ms, 2))
                print(
                    f"round {round_ + 1}, {label}: {cpu_ms:.2f} ms CPU, {wall_ms:.2f} ms wall "
                    "per pod",
                    flush=True,
                )
    return {
        "cpu_ms_per_pod": cpu,
        "wall_ms_per_pod": wall,
        "median_cpu_ms": {label: statistics.median(v) for label, v in cpu.items()},
        "median_wall_ms": {label: statistics.median(v) for label, v in wall.items()},
        "conditions": {
            **common_conditions(),
            "pods_per_measurement": PODS,
            "rounds": ROUNDS,
            "pod": f"the operator's worker pod for 4 x 1 GPU, gated, "
            f"{size:.0f} bytes of JSON on average",
            "cpu": "kube-apiserver user + system CPU seconds from /proc, over the writes "
            f"(read to 0.1 s: {100 / PODS:.2f} ms per pod)",
            "load_1min_after": round(os.getloadavg()[0], 2),
            "machine": f"{os.cpu_count()} cores, {platform.machine()}, "
            f"Python {platform.python_version()}",
        },
    }


def report(result: dict[str, Any]) -> str:
    lines = [
        "# kube-apiserver CPU and wall time per worker pod written, by how it is written",
        "",
        "| write | CPU ms per pod, each round | median | wall ms per pod, each round | median |",
        "|---|---|---|---|---|",
    ]
    for label, values in result["cpu_ms_per_pod"].items():
        each = ", ".join(f"{v:.2f}" for v in values)
        walls = ", ".join(f"{v:.2f}" for v in result["wall_ms_per_pod"][label])
        lines.append(
            f"| {label} | {each} | {result['median_cpu_ms'][label]:.2f} | {walls} | "
            f"{result['median_wall_ms'][label]:.2f} |"
        )
    lines += conditions_lines(result["conditions"])
    return "\n".join(lines) + "\n"


def main() -> int:
    result = run()
    write_results(RESULTS, result, report(result))
    print(report(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
