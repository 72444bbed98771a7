"""Fixtures of the end-to-end tests: the integration fixtures, imported, plus a test kubelet.

The cluster, the chart and the operator are the integration tests' own
fixtures (one place defines them). Run e2e in a pytest session of its own
(`make test` does): fixtures imported into two conftests are two fixtures to
pytest, so a session holding both directories would start two operators.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster.controlplane import Cluster
from e2e.kubelet import TestKubelet
from integration.conftest import cluster, namespace
from integration.trainwave_fixtures import operator, running_operator, trainwave_installed

__all__ = [
    "cluster",
    "namespace",
    "operator",
    "running_operator",
    "test_kubelet",
    "trainwave_installed",
]

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def test_kubelet(
    cluster: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TestKubelet]:
    """Two Nodes (8 GPUs each, labels like the simulated ones) run by a test kubelet."""
    kubelet = TestKubelet(
        cluster.kubeconfig,
        tmp_path_factory.mktemp("kubelet"),
        venv=Path(sys.prefix),
        nodes=2,
        # What the images hold: trainwave (runtime image) from this checkout.
        image_env={"PYTHONPATH": str(REPO / "operator"), "OMP_NUM_THREADS": "1"},
    )
    try:
        kubelet.start()
        names = [f"node/{name}" for name in kubelet.node_names]
        cluster.kubectl("wait", "--for=condition=Ready", *names, "--timeout=30s")
        yield kubelet
    finally:
        kubelet.stop()
