"""Fixtures for tests against the real local control plane (tests/cluster).

`cluster` (session): the control plane with the small topology, started on
demand. A cluster that was already running is reused and left running; one
this session started is stopped at the end unless TRAINWAVE_KEEP_CLUSTER=1.
Under pytest-xdist (`make test`, `make integration`) each worker has its own.

`namespace` (per test): a fresh namespace whose `default` ServiceAccount
exists (pods are refused until it does), deleted after the test without
waiting, so teardown never blocks on the namespace controller.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster.controlplane import DEFAULT_TOPOLOGY, Cluster, default_state_dir, ensure_cluster


def session_state_dir() -> Path | None:
    """Where this session's cluster lives: the default (TRAINWAVE_CLUSTER_DIR, else the
    cache's `cluster`), or, in a pytest-xdist worker, a directory of the worker's own
    (`cluster-gw0`, ...). Each worker is a session with its own chart and operator, so it
    needs a cluster of its own: two operators on one cluster would place onto the same
    nodes, and a test that kills or upgrades its operator would cut the other's jobs short."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not worker:
        return None
    shared = default_state_dir()
    return shared.with_name(f"{shared.name}-{worker}")


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    running = ensure_cluster(DEFAULT_TOPOLOGY, session_state_dir())
    yield running
    if running.started and os.environ.get("TRAINWAVE_KEEP_CLUSTER") != "1":
        running.stop()


@pytest.fixture
def namespace(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    name = namespace_name(request.node.name)
    cluster.kubectl("create", "namespace", name)
    cluster.kubectl("wait", "--for=create", "serviceaccount/default", "-n", name, "--timeout=30s")
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def namespace_name(test_name: str) -> str:
    """A valid, unique namespace name that still says which test made it."""
    slug = re.sub(r"[^a-z0-9]+", "-", test_name.lower()).strip("-")[:40].strip("-")
    return f"t-{slug}-{uuid.uuid4().hex[:6]}"


# trainwave itself: the chart installed once, the operator as its ServiceAccount.
from integration.trainwave_fixtures import (  # noqa: E402
    operator,
    running_operator,
    trainwave_installed,
)

__all__ = ["cluster", "namespace", "operator", "running_operator", "trainwave_installed"]
