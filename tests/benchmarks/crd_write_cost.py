"""Diagnostic: what one TrainingJob status patch costs kube-apiserver, by CRD schema.

At 500 jobs on 1,024 nodes (bench_scale.py) the operator's status patches are the largest
group of writes the bare pods do not have, and each costs the API server more than a pod
write. This measures why, on its own small cluster (tests/cluster/topologies/small.yaml, in
its own state directory), with nothing else writing: the CRD is installed in one variant
after another, one TrainingJob is created (the scale benchmark's spec), and PATCHES status
patches are sent one after another as the operator sends them (a JSON merge patch of the
whole status with the resourceVersion it replaces). Measured: kube-apiserver's CPU seconds
(user + system, /proc) over the patches, per patch. Variants, each from the generated CRD
(crds/trainingjobs.trainwave.io.yaml):

- full: as shipped;
- no transition rules: without the CEL rules that read oldSelf (spec immutability);
- no CEL: without any x-kubernetes-validations rule;
- no defaults: without any `default`;
- no CEL, no defaults;
- minimal: spec and status `x-kubernetes-preserve-unknown-fields`, nothing else.

The variants run ROUNDS times in turn, so a change of the machine's load shows as spread
within a variant rather than as a difference between them. A diagnostic: `make
bench-crd-cost`, not part of `make bench`. Environment: CRD_COST_PATCHES (300), CRD_COST_ROUNDS (3), BENCH_KEEP_CLUSTER (0).
Writes tests/benchmarks/results/crd_write_cost.{json,md}.
"""

from __future__ import annotations

import copy
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

import yaml  # noqa: E402

from benchmarks.apiserver_cluster import (  # noqa: E402
    apiserver_cluster,
    common_conditions,
    conditions_lines,
)
from benchmarks.provenance import write_results  # noqa: E402
from benchmarks.scale_measures import process_cpu_seconds  # noqa: E402
from cluster.api import ApiClient, ApiError  # noqa: E402

CRD_FILE = REPO / "crds" / "trainingjobs.trainwave.io.yaml"
STATE_DIR = Path.home() / ".cache" / "trainwave" / "bench-crd-cost"
RESULTS = REPO / "tests" / "benchmarks" / "results" / "crd_write_cost"
PATCHES = int(os.environ.get("CRD_COST_PATCHES", "300"))
ROUNDS = int(os.environ.get("CRD_COST_ROUNDS", "3"))
KEEP_CLUSTER = os.environ.get("BENCH_KEEP_CLUSTER", "0") == "1"
NAMESPACE = "crd-cost"
GROUP_PATH = "/apis/trainwave.io/v1alpha1"
CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
MERGE_PATCH = "application/merge-patch+json"
# A running job's status as the operator writes it (lifecycle/decide.py's fields).
STATUS: dict[str, Any] = {
    "phase": "Running",
    "reason": "AllWorkersRunning",
    "message": "4 workers running",
    "conditions": [
        {
            "type": kind,
            "status": "True",
            "reason": reason,
            "message": message,
            "lastTransitionTime": "2026-11-26T10:00:00Z",
            "observedGeneration": 1,
        }
        for kind, reason, message in (
            ("Created", "WorkersCreated", "4 workers created"),
            ("Scheduled", "AllWorkersBound", "4 workers bound"),
            ("Running", "AllWorkersRunning", "4 workers running"),
        )
    ],
    "attempt": 0,
    "readyWorkers": 4,
    "totalWorkers": 4,
    "ready": "4/4",
    "gpus": 4,
    "startTime": "2026-11-26T10:00:00Z",
    "attemptStartTime": "2026-11-26T10:00:00Z",
    "allRunningTime": "2026-11-26T10:00:02Z",
    "placement": {"nodes": ["node-a"], "summary": "4 workers x 1 GPUs on 1 node"},
}


def without_rules(schema: Any, keep: Callable[[dict[str, Any]], bool]) -> Any:
    """`schema` with only the x-kubernetes-validations rules `keep` accepts."""
    if isinstance(schema, dict):
        result = {}
        for key, value in schema.items():
            if key == "x-kubernetes-validations":
                rules = [rule for rule in value if keep(rule)]
                if rules:
                    result[key] = rules
            else:
                result[key] = without_rules(value, keep)
        return result
    if isinstance(schema, list):
        return [without_rules(item, keep) for item in schema]
    return schema


def without_defaults(schema: Any) -> Any:
    if isinstance(schema, dict):
        return {k: without_defaults(v) for k, v in schema.items() if k != "default"}
    if isinstance(schema, list):
        return [without_defaults(item) for item in schema]
    return schema


def minimal(crd: dict[str, Any]) -> dict[str, Any]:
    crd = copy.deepcopy(crd)
    for version in crd["spec"]["versions"]:
        schema = version["schema"]["openAPIV3Schema"]
        schema.pop("x-kubernetes-validations", None)
        for part in ("spec", "status"):
            schema["properties"][part] = {
                "type": "object",
                "x-kubernetes-preserve-unknown-fields": True,
            }
    return crd


def variants(crd: dict[str, Any]) -> dict[str, dict[str, Any]]:
    def no_old_self(rule: dict[str, Any]) -> bool:
        return "oldSelf" not in rule["rule"]

    no_cel = without_rules(crd, lambda rule: False)
    return {
        "full": crd,
        "no transition rules": without_rules(crd, no_old_self),
        "no CEL": no_cel,
        "no defaults": without_defaults(crd),
        "no CEL, no defaults": without_defaults(no_cel),
        "minimal": minimal(crd),
    }


def install(api: ApiClient, crd: dict[str, Any]) -> None:
    """Replace the CRD and wait until the API server serves it again."""
    name = crd["metadata"]["name"]
    try:
        current = api.get(f"{CRD_PATH}/{name}")
    except ApiError as error:
        if error.status != 404:
            raise
        api.request("POST", CRD_PATH, crd)
    else:
        body = copy.deepcopy(crd)
        body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        api.request("PUT", f"{CRD_PATH}/{name}", body)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        conditions = (api.get(f"{CRD_PATH}/{name}").get("status") or {}).get("conditions") or []
        if any(c["type"] == "Established" and c["status"] == "True" for c in conditions):
            time.sleep(3)  # the handler for the new schema is swapped in after Established
            return
        time.sleep(0.5)
    raise RuntimeError(f"CRD {name} not established within 60 s")


def patch_cost(api: ApiClient, apiserver_pid: int, name: str) -> float:
    """Milliseconds of kube-apiserver CPU per status patch of a new job `name`."""
    jobs = f"{GROUP_PATH}/namespaces/{NAMESPACE}/trainingjobs"
    job = {
        "apiVersion": "trainwave.io/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"workers": 4, "gpusPerWorker": 1, "image": "bench:1"},
    }
    version = api.request("POST", jobs, job)["metadata"]["resourceVersion"]
    time.sleep(1)  # the create's own echoes (watch fan-out, GC) out of the window
    before = process_cpu_seconds(apiserver_pid)
    for i in range(PATCHES):
        status = STATUS | {"message": f"{i % 5}/4 workers running", "readyWorkers": i % 5}
        patch = {"metadata": {"resourceVersion": version}, "status": status}
        written = api.request("PATCH", f"{jobs}/{name}/status", patch, MERGE_PATCH)
        version = written["metadata"]["resourceVersion"]
    after = process_cpu_seconds(apiserver_pid)
    api.request("DELETE", f"{jobs}/{name}")
    if before is None or after is None:
        raise RuntimeError("kube-apiserver went away during the patches")
    return (after - before) / PATCHES * 1000


def run() -> dict[str, Any]:
    crd = yaml.safe_load(CRD_FILE.read_text())
    measured: dict[str, list[float]] = {}
    with apiserver_cluster(STATE_DIR, NAMESPACE, keep=KEEP_CLUSTER) as (api, apiserver):
        for round_ in range(ROUNDS):
            for index, (label, variant) in enumerate(variants(crd).items()):
                install(api, variant)
                ms = patch_cost(api, apiserver, f"cost-{round_}-{index}")
                measured.setdefault(label, []).append(round(ms, 2))
                print(f"round {round_ + 1}, {label}: {ms:.2f} ms per status patch", flush=True)
        install(api, crd)
    return {
        "ms_per_status_patch": measured,
        "median_ms": {label: statistics.median(values) for label, values in measured.items()},
        "conditions": {
            **common_conditions(),
            "patches_per_measurement": PATCHES,
            "rounds": ROUNDS,
            "patch": "JSON merge patch of the whole status (about 850 bytes) with the "
            "resourceVersion it replaces, as the operator sends it",
            "cpu": "kube-apiserver user + system CPU seconds from /proc, over the patches "
            f"(read to 0.1 s: {100 / PATCHES:.2f} ms per patch)",
            "machine": f"{os.cpu_count()} cores, {platform.machine()}, "
            f"Python {platform.python_version()}; shared with other engineers' tests",
        },
    }


def report(result: dict[str, Any]) -> str:
    lines = [
        "# kube-apiserver CPU per TrainingJob status patch, by CRD schema",
        "",
        "| CRD | ms per patch, each round | median |",
        "|---|---|---|",
    ]
    for label, values in result["ms_per_status_patch"].items():
        each = ", ".join(f"{v:.2f}" for v in values)
        lines.append(f"| {label} | {each} | {result['median_ms'][label]:.2f} |")
    lines += conditions_lines(result["conditions"])
    return "\n".join(lines) + "\n"


def main() -> int:
    result = run()
    write_results(RESULTS, result, report(result))
    print(report(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
