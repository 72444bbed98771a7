"""Rendering charts/trainwave with `helm template` for the chart tests (test_chart*.py):
the helm binary found, one cached rendering per set of flags, and the lookups the tests
share. Without helm the tests that render are skipped, not failed."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "trainwave"
NAMESPACE = "tw-system"
RELEASE = "tw"


def find_helm() -> str | None:
    """$HELM, then PATH, then the pinned binary `make tools` installs into the cache."""
    cache = Path(os.environ.get("TRAINWAVE_CACHE", Path.home() / ".cache" / "trainwave"))
    for candidate in (os.environ.get("HELM"), shutil.which("helm"), cache / "bin" / "helm"):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


HELM = find_helm()


def helm() -> str:
    """The helm binary, or skip the calling test: the schema generator tests still run."""
    if HELM is None:
        pytest.skip("helm is not installed (run `make tools`)")
    return HELM


@functools.cache
def helm_template(
    args: tuple[str, ...], release: str = RELEASE
) -> subprocess.CompletedProcess[str]:
    # Cached: many tests look at the same rendering, and each helm run costs ~0.1 s.
    command = [helm(), "template", release, str(CHART), "--namespace", NAMESPACE, *args]
    return subprocess.run(command, capture_output=True, text=True, check=False, timeout=15)


def render(*args: str, release: str = RELEASE) -> list[dict[str, Any]]:
    """The manifests rendered with extra helm flags (`--set a=b`, `--set-json ...`)."""
    result = helm_template(args, release)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def render_error(*args: str) -> str:
    """The error helm prints when the flags must make rendering fail."""
    result = helm_template(args)
    assert result.returncode != 0, f"helm template {' '.join(args)} should have failed"
    return result.stderr


def is_agent(doc: dict[str, Any]) -> bool:
    labels = doc["metadata"].get("labels") or {}
    return bool(labels.get("app.kubernetes.io/component") == "agent")


def find(
    manifests: list[dict[str, Any]], kind: str, *, agent: bool = False
) -> list[dict[str, Any]]:
    """Objects of one kind: the operator's and the release's, or with `agent` the node agent's
    (tests/unit/test_chart_agent.py), so neither set of tests counts the other's objects."""
    return [doc for doc in manifests if doc["kind"] == kind and is_agent(doc) == agent]


def one(manifests: list[dict[str, Any]], kind: str, *, agent: bool = False) -> dict[str, Any]:
    found = find(manifests, kind, agent=agent)
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def pod_spec(manifests: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = one(manifests, "Deployment")["spec"]["template"]["spec"]
    return spec


def container(manifests: list[dict[str, Any]]) -> dict[str, Any]:
    operator: dict[str, Any]
    (operator,) = pod_spec(manifests)["containers"]
    return operator


def granted(role: dict[str, Any]) -> dict[tuple[str, str], set[str]]:
    grants: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        assert set(rule) <= {"apiGroups", "resources", "verbs"}, f"unexpected rule fields {rule}"
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                grants.setdefault((group, resource), set()).update(rule["verbs"])
    return grants


def named(manifests: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [m for m in find(manifests, kind) if m["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, got {len(found)}"
    return found[0]
