"""Chart tests of the switches: CRDs kept or not, the ServiceMonitor, and values.schema.json
(generated from values.yaml, refusing bad values) with helm lint (chart_render.py renders).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from chart_render import (
    CHART,
    ROOT,
    find,
    helm,
    one,
    render,
    render_error,
)

pytestmark = pytest.mark.timeout(20)

# --- CRD and ServiceMonitor toggles ---------------------------------------------------------

KEEP = "helm.sh/resource-policy"


@pytest.mark.parametrize(
    ("args", "present", "kept"),
    [
        pytest.param((), True, True, id="default-installed-and-kept"),
        pytest.param(("--set", "crds.keep=false"), True, False, id="not-kept"),
        pytest.param(("--set", "crds.enabled=false"), False, False, id="disabled"),
    ],
)
def test_crd_toggles(args: tuple[str, ...], present: bool, kept: bool) -> None:
    crds = find(render(*args), "CustomResourceDefinition")
    assert [crd["metadata"]["name"] for crd in crds] == (
        ["trainingjobs.trainwave.io"] if present else []
    )
    if present:
        annotations = crds[0]["metadata"].get("annotations") or {}
        assert (annotations.get(KEEP) == "keep") is kept


def test_service_monitor_is_off_by_default() -> None:
    assert not find(render(), "ServiceMonitor")


def test_service_monitor_scrapes_the_metrics_service() -> None:
    manifests = render(
        "--set", "metrics.serviceMonitor.enabled=true",
        "--set", "metrics.serviceMonitor.labels.release=prometheus",
        "--set", "metrics.serviceMonitor.interval=15s",
    )  # fmt: skip
    monitor = one(manifests, "ServiceMonitor")
    service = one(manifests, "Service")
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert monitor["spec"]["endpoints"] == [
        {"port": "metrics", "path": "/metrics", "interval": "15s"}
    ]


def test_service_monitor_needs_the_service() -> None:
    error = render_error(
        "--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.service.enabled=false"
    )
    assert "needs metrics.service.enabled" in error


# --- values.schema.json ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(("--set", "imagee.tag=x"), "additional properties 'imagee'", id="unknown-key"),
        pytest.param(("--set", "image.tga=x"), "additional properties 'tga'", id="unknown-nested"),
        pytest.param(("--set", "metrics.port=abc"), "want integer", id="wrong-type"),
        pytest.param(("--set", "image.tag=2"), "want string", id="numeric-tag"),
        pytest.param(("--set", "logLevel=verbose"), "must be one of", id="not-in-enum"),
        pytest.param(("--set", "health.port=70000"), "maximum", id="out-of-range"),
        pytest.param(
            ("--set", "runtime.statusIntervalSeconds=0"), "minimum", id="status-interval-zero"
        ),
        pytest.param(("--set", "queue.maxSkips=-1"), "minimum", id="max-skips-negative"),
        pytest.param(("--set", "podAnnotations.a=1"), "want string", id="annotation-not-string"),
        pytest.param(
            ("--set-json", 'watchNamespaces=["team-*"]'),
            "does not match pattern",
            id="namespace-pattern",
        ),
    ],
)
def test_schema_rejects_bad_values(args: tuple[str, ...], message: str) -> None:
    error = render_error(*args)
    assert "values don't meet the specifications of the schema" in error
    assert message in error


def test_schema_is_generated_from_values() -> None:
    # `make check-generated` does this too; here it fails next to the chart tests.
    result = subprocess.run(
        [sys.executable, str(ROOT / "hack" / "values_schema.py"), str(CHART / "values.yaml")],
        capture_output=True,
        text=True,
        check=True,
        timeout=15,
    )
    committed = (CHART / "values.schema.json").read_text(encoding="utf-8")
    assert result.stdout == committed, "values.schema.json is stale: run `make generate`"


def test_schema_generator_refuses_an_undocumented_value(tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text("# -- Documented.\ndocumented: 1\nundocumented: 2\n", encoding="utf-8")
    result = subprocess.run(
        [sys.executable, str(ROOT / "hack" / "values_schema.py"), str(values)],
        capture_output=True,
        text=True,
        check=False,
        timeout=15,
    )
    assert result.returncode == 1
    assert f'{values}:3: undocumented: no "# -- <description>" comment' in result.stderr


def test_helm_lint_strict_passes() -> None:
    result = subprocess.run(
        [helm(), "lint", "--strict", str(CHART)],
        capture_output=True,
        text=True,
        check=False,
        timeout=15,
    )
    assert result.returncode == 0, result.stdout + result.stderr
