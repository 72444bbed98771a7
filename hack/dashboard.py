"""Write the trainwave Grafana dashboard (charts/trainwave/dashboards/trainwave.json).

`make generate` runs it and CI checks the output for drift: edit the panels here,
not the JSON. The chart ships the JSON in a ConfigMap for Grafana's dashboard
sidecar (templates/dashboard-configmap.yaml). tests/host/test_chart_dashboards.py
checks its structure; tests/integration/test_dashboard_metrics.py checks that
every metric and label a query names is served by a real operator.
"""

from __future__ import annotations

import json
import sys
from typing import Any

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
RATE = "$__rate_interval"
WIDTH = 24


def target(expr: str, legend: str, ref: str) -> dict[str, Any]:
    return {"datasource": DATASOURCE, "expr": expr, "legendFormat": legend, "refId": ref}


def quantiles(metric: str, *qs: float) -> list[tuple[str, str]]:
    """p50/p95... of a histogram over every series of the metric."""
    return [
        (
            f"histogram_quantile({q}, sum by (le) (rate({metric}_bucket[{RATE}])))",
            f"p{round(q * 100)}",
        )
        for q in qs
    ]


def panel(
    title: str,
    description: str,
    queries: list[tuple[str, str]],
    *,
    kind: str = "timeseries",
    unit: str = "short",
    stack: bool = False,
    width: int = 12,
) -> dict[str, Any]:
    custom = {"stacking": {"mode": "normal" if stack else "none"}} if kind == "timeseries" else {}
    return {
        "type": kind,
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "fieldConfig": {"defaults": {"unit": unit, "custom": custom}, "overrides": []},
        "options": {},
        "targets": [target(e, legend, chr(ord("A") + i)) for i, (e, legend) in enumerate(queries)],
        "gridPos": {"w": width, "h": 8},  # x, y and id are set by layout()
    }


PANELS = [
    panel(
        "Operator instances leading",
        "trainwave_leader summed: 1 is healthy, 0 means no instance reconciles.",
        [("sum(trainwave_leader)", "leaders")],
        kind="stat",
        width=6,
    ),
    panel(
        "Gangs waiting",
        "Gangs behind the scheduling gate after the last placement round.",
        [("sum(trainwave_gangs_waiting)", "waiting")],
        kind="stat",
        width=6,
    ),
    panel(
        "Shared-GPU fragmentation",
        "Share of idle shared-GPU capacity the typical next task could not use (FGD measure).",
        [
            (
                "sum(trainwave_shared_gpu_fragmented_milli)"
                " / clamp_min(sum(trainwave_shared_gpu_idle_milli), 1)",
                "fragmented",
            )
        ],
        kind="stat",
        unit="percentunit",
        width=6,
    ),
    panel(
        "Reconcile errors",
        "Reconciles that raised and were retried, per second.",
        [(f"sum(rate(trainwave_reconcile_errors_total[{RATE}]))", "errors/s")],
        kind="stat",
        unit="reqps",
        width=6,
    ),
    panel(
        "TrainingJobs by phase",
        "How many TrainingJobs are in each phase now.",
        [("sum by (phase) (trainwave_jobs)", "{{phase}}")],
        stack=True,
    ),
    panel(
        "Time to all workers Running",
        "From a gang's first pod created to every worker Running.",
        quantiles("trainwave_time_to_all_workers_running_seconds", 0.5, 0.95),
        unit="s",
    ),
    panel(
        "Gangs waiting, by reason",
        "Waiting gangs by the placer's reason code (the job's Scheduled condition says more).",
        [("sum by (reason) (trainwave_gangs_waiting_by_reason)", "{{reason}}")],
        stack=True,
    ),
    panel(
        "Longest waiting gangs",
        "The ten gangs waiting longest for a place, with why.",
        [
            (
                "topk(10, max by (job_namespace, job_name, reason)"
                " (trainwave_gang_waiting_seconds))",
                "{{job_namespace}}/{{job_name}} ({{reason}})",
            )
        ],
        unit="s",
    ),
    panel(
        "GPUs by $level",
        "Whole GPUs per domain of the chosen topology level: allocated, free, unavailable "
        "(cordoned or not Ready nodes).",
        [('sum by (domain, state) (trainwave_gpus{level="$level"})', "{{domain}} {{state}}")],
        stack=True,
        width=WIDTH,
    ),
    panel(
        "Shared GPUs: idle and fragmented",
        "Idle milli-GPU over the GPUs offered for sharing, and the part of it that is fragmented.",
        [
            ("sum(trainwave_shared_gpu_idle_milli)", "idle"),
            ("sum(trainwave_shared_gpu_fragmented_milli)", "fragmented"),
            ("sum(trainwave_shared_gpus) * 1000", "offered"),
        ],
    ),
    panel(
        "Gang restarts, by cause",
        "New attempts per cause: failure (counted), disruption, preemption, ignored, hang.",
        [(f"sum by (cause) (increase(trainwave_gang_restarts_total[{RATE}]))", "{{cause}}")],
        stack=True,
    ),
    panel(
        "Goodput by job",
        "status.goodput.ratio of each job with the runtime: productive step time over wall "
        "time since its start (docs/goodput.md).",
        [
            (
                "max by (job_namespace, job_name) (trainwave_job_goodput_ratio)",
                "{{job_namespace}}/{{job_name}}",
            )
        ],
        unit="percentunit",
    ),
    panel(
        "Hangs, stragglers and in-place restarts",
        "Gangs found hung, ranks named stragglers, gang bandwidth tests failed (preflight), "
        "training processes restarted inside their pods by cause (from the runtime's "
        "reports), and workers replaced alone while the rest of the gang kept its pods.",
        [
            (f"sum(increase(trainwave_hangs_total[{RATE}]))", "hangs"),
            (f"sum(increase(trainwave_stragglers_total[{RATE}]))", "stragglers"),
            (
                f'sum(increase(trainwave_preflight_tests_total{{result="failed"}}[{RATE}]))',
                "preflight failed",
            ),
            (
                f"sum by (cause) (increase(trainwave_in_place_restarts_total[{RATE}]))",
                "in place: {{cause}}",
            ),
            (
                f"sum by (cause) (increase(trainwave_workers_replaced_total[{RATE}]))",
                "worker replaced: {{cause}}",
            ),
        ],
        stack=True,
    ),
    panel(
        "Placement round latency",
        "A whole round (read, decide, release) and its pure decision.",
        [
            *quantiles("trainwave_placement_round_duration_seconds", 0.5, 0.99),
            *[
                (e, f"decision {legend}")
                for e, legend in quantiles("trainwave_placement_decision_seconds", 0.99)
            ],
        ],
        unit="s",
    ),
    panel(
        "Reconciles",
        "Reconcile latency, and the errors that were retried.",
        [
            *quantiles("trainwave_reconcile_duration_seconds", 0.5, 0.99),
            (f"sum(rate(trainwave_reconcile_errors_total[{RATE}]))", "errors/s"),
        ],
        unit="s",
    ),
]


def layout(panels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows left to right, top to bottom, in list order; ids in the same order."""
    x = y = row_height = 0
    placed = []
    for number, item in enumerate(panels, start=1):
        w, h = item["gridPos"]["w"], item["gridPos"]["h"]
        if x + w > WIDTH:
            x, y, row_height = 0, y + row_height, 0
        placed.append({**item, "id": number, "gridPos": {"x": x, "y": y, "w": w, "h": h}})
        x, row_height = x + w, max(row_height, h)
    return placed


def dashboard() -> dict[str, Any]:
    return {
        "uid": "trainwave",
        "title": "trainwave",
        "description": "TrainingJobs, gang placement and GPUs managed by the trainwave operator.",
        "tags": ["trainwave", "kubernetes", "gpu"],
        "timezone": "browser",
        "editable": True,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Data source",
                    "type": "datasource",
                    "query": "prometheus",
                },
                {
                    "name": "level",
                    "label": "Topology level",
                    "type": "query",
                    "datasource": DATASOURCE,
                    "query": {"query": "label_values(trainwave_gpus, level)", "refId": "level"},
                    "refresh": 2,
                    "current": {"text": "rack", "value": "rack"},
                },
            ]
        },
        "annotations": {"list": []},
        "panels": layout(PANELS),
    }


if __name__ == "__main__":
    json.dump(dashboard(), sys.stdout, indent=2, sort_keys=True)
    sys.stdout.write("\n")
