"""A local cluster with one real node (kubelet + containerd) beside the kwok nodes.

`cluster` here replaces the integration fixture of the same name for the tests below
this directory: the same control plane, started with `real_nodes=1`. Real nodes need
root, iproute2 and the parts from `make tools`; without them `ensure_cluster` raises and
every test here errors. That is deliberate: CI must see a missing prerequisite, not a skip.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from cluster.controlplane import DEFAULT_TOPOLOGY, Cluster, ensure_cluster

__all__ = ["cluster"]


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    running = ensure_cluster(DEFAULT_TOPOLOGY, real_nodes=1, timeout=180)
    yield running
    if running.started and os.environ.get("TRAINWAVE_KEEP_CLUSTER") != "1":
        running.stop()


DOWN_TEST = "test_down_leaves_nothing_on_the_host"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The test of `down` stops the cluster every e2e test shares: run it after all of
    them, not first (its directory sorts before tests/e2e/test_*.py)."""
    last = [item for item in items if item.name == DOWN_TEST]
    items[:] = [item for item in items if item.name != DOWN_TEST] + last
