"""Every series the chart's dashboard and alerts read is served by a real operator.

The operator runs against the local control plane with a gang that cannot be placed
(so the waiting gauges have series) and one that runs; its /metrics text is then
checked against every PromQL expression of the rendered chart (tests/unit/promql.py).
"""

from __future__ import annotations

import subprocess

import pytest
import yaml

from host.chart_render import CHART, helm
from integration.trainwave_fixtures import apply, job_manifest, wait_for_phase, wait_until
from unit.promql import chart_queries, problems

pytestmark = pytest.mark.integration

RUNTIME_ONLY = "trainwave_job_goodput_ratio"


def rendered() -> list[dict]:
    command = [helm(), "template", "tw", str(CHART), "--namespace", "tw-system"]
    command += ["--set", "dashboards.enabled=true", "--set", "alerts.enabled=true"]
    out = subprocess.run(command, capture_output=True, text=True, check=True, timeout=30)
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


def test_every_panel_and_alert_reads_what_the_operator_serves(cluster, namespace, running_operator):
    apply(cluster, namespace, job_manifest("fits"), job_manifest("too-big", workers=64, gpus=8))
    wait_for_phase(cluster, namespace, "fits", "Succeeded")

    def waiting() -> str | None:
        text = running_operator.metrics()
        return text if "trainwave_gang_waiting_seconds{" in text else None

    text = wait_until(waiting, 60, "the unplaceable gang in the waiting gauges")
    queries = chart_queries(rendered())
    assert len(queries) > 20
    # A job's goodput ratio needs the runtime's reports: test_goodput_channel.py checks its panel.
    queries = [(where, expr) for where, expr in queries if RUNTIME_ONLY not in expr]
    found = [f"{where}: {p}" for where, expr in queries for p in problems(expr, text)]
    assert not found, "\n".join(found)
    assert f'job_name="too-big",job_namespace="{namespace}"' in text
