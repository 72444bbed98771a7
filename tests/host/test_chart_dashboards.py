"""The Grafana dashboard and the PrometheusRule the chart ships, and the PromQL they hold.

The checks here are the structure Grafana needs to import a dashboard — required keys, the
datasource variable every panel uses, known panel types, unique ids and refIds, a grid
without overlaps; the keys and value types are checked against Grafana's published schema
types in test_dashboard_schema.py.
That each query reads only series the operator serves is checked here against the
metrics module's own registry and, on a real operator, in
tests/integration/test_dashboard_metrics.py.
"""

from __future__ import annotations

import importlib.util
import json
from typing import Any

import pytest
from chart_render import CHART, ROOT, find, render
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest

from trainwave.controller import metrics
from trainwave.placement.occupancy import DomainGpus
from unit.promql import Selector, chart_queries, problems, selectors

pytestmark = pytest.mark.timeout(20)
ON = ("--set", "dashboards.enabled=true", "--set", "alerts.enabled=true")
PANEL_TYPES = {"timeseries", "stat", "table", "bargauge", "gauge"}


def dashboard(*args: str) -> dict[str, Any]:
    (config,) = [
        c for c in find(render(*ON, *args), "ConfigMap") if "dashboard" in c["metadata"]["name"]
    ]
    loaded: dict[str, Any] = json.loads(config["data"]["trainwave.json"])
    return loaded


def rules(*args: str) -> dict[str, dict[str, Any]]:
    (rule,) = find(render(*ON, *args), "PrometheusRule")
    return {r["alert"]: r for group in rule["spec"]["groups"] for r in group["rules"]}


def test_both_are_off_by_default() -> None:
    kinds = {(d["kind"], d["metadata"]["name"]) for d in render()}
    assert ("PrometheusRule", "tw-trainwave") not in kinds
    assert ("ConfigMap", "tw-trainwave-dashboard") not in kinds


def test_the_configmap_carries_the_label_the_grafana_sidecar_watches() -> None:
    (config,) = [
        c
        for c in find(render(*ON, "--set", "dashboards.namespace=monitoring"), "ConfigMap")
        if "dashboard" in c["metadata"]["name"]
    ]
    assert config["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config["metadata"]["namespace"] == "monitoring"


def test_the_committed_json_is_what_hack_dashboard_generates() -> None:
    spec = importlib.util.spec_from_file_location("dashboard", ROOT / "hack" / "dashboard.py")
    assert spec
    assert spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    committed = json.loads((CHART / "dashboards" / "trainwave.json").read_text())
    assert committed == module.dashboard(), "run `make generate`"


def test_the_dashboard_has_the_structure_grafana_imports() -> None:
    board = dashboard()
    for key, kind in (("uid", str), ("title", str), ("schemaVersion", int), ("panels", list)):
        assert isinstance(board[key], kind), key
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    assert all(isinstance(i, int) for i in ids)
    cells: set[tuple[int, int]] = set()
    for panel in board["panels"]:
        assert panel["type"] in PANEL_TYPES, panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        grid = panel["gridPos"]
        assert grid["x"] >= 0
        assert grid["x"] + grid["w"] <= 24
        assert grid["h"] > 0
        area = {
            (x, y)
            for x in range(grid["x"], grid["x"] + grid["w"])
            for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not area & cells, f"{panel['title']} overlaps another panel"
        cells |= area
        refs = [t["refId"] for t in panel["targets"]]
        assert refs
        assert len(refs) == len(set(refs))
        assert all(t["expr"] and t["datasource"] == panel["datasource"] for t in panel["targets"])


def test_the_issue_asks_for_these_panels_and_alerts() -> None:
    titles = " | ".join(p["title"] for p in dashboard()["panels"])
    for words in (
        "by phase",
        "all workers Running",
        "waiting, by reason",
        "GPUs by",
        "fragmentation",
        "restarts, by cause",
        "Placement round",
        "Reconcile",
    ):
        assert words in titles
    assert set(rules()) == {
        "TrainwaveOperatorDown",
        "TrainwaveNoLeader",
        "TrainwaveJobSchedulingTooLong",
        "TrainwaveRestartStorm",
        "TrainwaveReconcileErrors",
    }


def test_alert_thresholds_and_labels_come_from_values() -> None:
    found = rules(
        "--set",
        "alerts.schedulingMinutes=45",
        "--set",
        "alerts.restartStormWindow=1h",
        "--set",
        "alerts.alertLabels.severity=page",
    )
    assert found["TrainwaveJobSchedulingTooLong"]["expr"].rstrip().endswith("> 2700")
    assert "[1h]" in found["TrainwaveRestartStorm"]["expr"]
    assert {r["labels"]["severity"] for r in found.values()} == {"page"}
    # Alerts select the series Prometheus scraped through the chart's metrics Service.
    assert 'job="tw-trainwave-metrics", namespace="tw-system"' in found["TrainwaveNoLeader"]["expr"]
    assert (
        "{{ $labels.job_name }}" in found["TrainwaveJobSchedulingTooLong"]["annotations"]["summary"]
    )


@pytest.mark.parametrize(
    ("expr", "metrics_read", "grouping"),
    [
        ("sum by (phase) (trainwave_jobs)", ["trainwave_jobs"], {"phase"}),
        ('rate(a_total{x="1", y=~"b|c"}[$__rate_interval])', ["a_total"], set()),
        ("sum(up{job='j'}) > 0 unless sum(b) > 0", ["up", "b"], set()),
        ("histogram_quantile(0.99, sum by (le) (rate(h_bucket[5m])))", ["h_bucket"], {"le"}),
        ("a / on (k) group_left (m) b", ["a", "b"], {"k", "m"}),
    ],
    ids=["aggregation", "matchers", "set-operator", "histogram", "vector-matching"],
)
def test_the_tokenizer_finds_every_selector(
    expr: str, metrics_read: list[str], grouping: set[str]
) -> None:
    reads = selectors(expr)
    assert [s.metric for s in reads.selectors] == metrics_read
    assert reads.grouping == grouping


def test_the_tokenizer_reads_matchers_and_refuses_what_it_does_not_know() -> None:
    assert selectors('m{a="x",b!~"y"}').selectors == [
        Selector("m", (("a", "=", "x"), ("b", "!~", "y")))
    ]
    with pytest.raises(ValueError, match="unknown function"):
        selectors("sun(m)")


def exposition() -> str:
    """The metrics module's registry with its scrape-time collectors run on sample data."""
    side = CollectorRegistry()
    side.register(metrics.JobsByPhase(lambda: {"Running": 1}))
    side.register(metrics.CacheStats(lambda: {"pods": (1, 0)}))
    side.register(metrics.JobGoodput(lambda: [("ns", "j", 0.9)]))
    metrics.PLACEMENT.state = metrics.PlacementState(
        waiting=(("ns", "j", "NeverFits", 0.0),), gpus=(DomainGpus("rack", "r", "free", 1),)
    )
    return generate_latest(REGISTRY).decode() + generate_latest(side).decode()


def test_every_query_reads_series_the_metrics_module_serves() -> None:
    text = exposition()
    queries = chart_queries(render(*ON))
    assert len(queries) > 20  # every panel and alert was found, not an empty list
    found = {f"{where}: {p}" for where, expr in queries for p in problems(expr, text)}
    assert not found


def test_the_check_fails_on_a_missing_metric_label_or_value() -> None:
    text = exposition()
    assert problems("sum(trainwave_gpu)", text) == ["metric trainwave_gpu is not served"]
    assert problems('trainwave_gpus{rack="r"}', text) == ["trainwave_gpus has no label rack"]
    assert problems('trainwave_gang_restarts_total{cause="oom"}', text) == [
        "trainwave_gang_restarts_total has no series with cause='oom'"
    ]
    assert problems("sum by (node) (trainwave_gpus)", text) == [
        "grouping label node is on no series read"
    ]
