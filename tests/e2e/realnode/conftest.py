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
