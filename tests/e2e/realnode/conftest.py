"""A local cluster with one real node (kubelet + containerd) beside the kwok nodes.

`cluster` here replaces the integration fixture of the same name for the tests below
this directory: the same control plane, started with `real_nodes=1`. `three_nodes`
restarts it with three real nodes, so the tests that use it run after every other e2e
test, and the test of `down` last of all. Real nodes need root, iproute2 and the parts from `make
tools`; without them `ensure_cluster` raises and every test here errors. That is
deliberate: CI must see a missing prerequisite, not a skip.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from cluster import realnode_host as host
from cluster.controlplane import DEFAULT_TOPOLOGY, Cluster, ensure_cluster
from e2e.conftest import Release, install_release

__all__ = ["cluster", "three_node_release", "three_nodes"]


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    running = ensure_cluster(DEFAULT_TOPOLOGY, real_nodes=1, timeout=180)
    yield running
    if running.started and os.environ.get("TRAINWAVE_KEEP_CLUSTER") != "1":
        running.stop()


@pytest.fixture(scope="session")
def three_nodes(cluster: Cluster) -> Cluster:
    """The session's cluster restarted with three real nodes (the chart, the kwok nodes'
    pods and everything else on it are gone): a gang of two whole-node workers and a node
    to move one to. Stopped by the test of `down`."""
    # Cold, each further node imports the ~1 GB of images again (35-45 s each here).
    return ensure_cluster(DEFAULT_TOPOLOGY, real_nodes=3, timeout=600)


@pytest.fixture(scope="session")
def three_node_release(three_nodes: Cluster) -> Release:
    """The chart installed again, on the three-node cluster (its agent on every node)."""
    return install_release(three_nodes)


def python_image() -> str:
    """The trainwave Python base of `make images` (it has python3 for in-pod checks)."""
    refs = [archive.ref for archive in host.image_archives()]
    found = [ref for ref in refs if "python" in ref.rsplit("/", 1)[-1]]
    if not found:
        raise AssertionError(
            f"no Python base image among the imported archives ({refs}); run `make images`"
        )
    return found[0]


DOWN_TEST = "test_down_leaves_nothing_on_the_host"
THREE_NODE_MODULES = ("test_more_nodes.py", "test_preflight_nodes.py", "test_drain_nodes.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests of three nodes restart the cluster every e2e test shares, and the test of
    `down` stops it: run them after all the others, in that order, not first (this
    directory sorts before tests/e2e/test_*.py)."""
    more = [item for item in items if item.path.name in THREE_NODE_MODULES]
    down = [item for item in items if item.name == DOWN_TEST]
    rest = [item for item in items if item not in more and item not in down]
    items[:] = rest + more + down
