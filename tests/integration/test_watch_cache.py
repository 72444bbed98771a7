"""The operator's cluster cache against the real API server: it follows nodes and pods
through watches, and a relist after a gap drops what was deleted meanwhile."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import pytest
from kubernetes import config

from cluster.controlplane import Cluster
from integration.node_pools import blocker_pod, node_pool
from integration.trainwave_fixtures import apply
from trainwave.contract import GPU_RESOURCE
from trainwave.controller.cluster_cache import ClusterCache
from trainwave.controller.clusterview import ClusterView, listed_view
from trainwave.controller.kube import KubeClient

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

T = TypeVar("T")


def eventually(check: Callable[[], T], timeout: float = 30.0, what: str = "") -> T:
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"not seen in {timeout:.0f}s: {what}")
        time.sleep(0.1)


@pytest.fixture
def kube(cluster: Cluster) -> KubeClient:
    return KubeClient(config.new_client_from_config(str(cluster.kubeconfig)))


@pytest.fixture
def cache(kube: KubeClient) -> Iterator[ClusterCache]:
    # A small page size, so the initial LIST of the test cluster is several pages.
    running = ClusterCache(kube, page_size=3, watch_seconds=30)
    running.start()
    assert running.wait_synced(30), "both informers listed"
    yield running
    running.stop()


def gpus_used(view: ClusterView, node: str) -> int:
    usage = view.usage.get(node)
    return usage.requests.get(GPU_RESOURCE, 0) if usage else 0


def test_cache_follows_nodes_and_pods(
    cluster: Cluster, namespace: str, cache: ClusterCache, kube: KubeClient
) -> None:
    changes: list[int] = []
    cache.on_change(lambda: changes.append(1))
    with node_pool(cluster, rack_sizes=(2,)) as pool:
        names = set(pool.nodes)
        eventually(
            lambda: names <= {n.name for n in cache.view().nodes}, what=f"pool nodes {names}"
        )
        node = pool.nodes[0]
        apply(cluster, namespace, blocker_pod("hold", node, 3))
        eventually(lambda: gpus_used(cache.view(), node) == 3, what="the blocker's 3 GPUs")
        assert gpus_used(listed_view(kube), node) == 3, "a fresh listing agrees"

        cluster.kubectl("delete", "pod", "hold", "-n", namespace, "--wait=true", timeout=90)
        eventually(lambda: node not in cache.view().usage, what="usage gone with the pod")
    eventually(lambda: not names & {n.name for n in cache.view().nodes}, what="pool nodes deleted")
    assert changes, "on_change callbacks ran"
    assert cache.nodes.events > 0
    assert cache.pods.events > 0
    assert cache.pods.relists == 0, "a healthy watch never relists"


def test_relist_after_a_gap_drops_a_pod_deleted_meanwhile(
    cluster: Cluster, namespace: str, cache: ClusterCache
) -> None:
    with node_pool(cluster, rack_sizes=(1,)) as pool:
        node = pool.nodes[0]
        apply(cluster, namespace, blocker_pod("phantom", node, 2))
        eventually(lambda: gpus_used(cache.view(), node) == 2, what="the blocker's 2 GPUs")

        cache.stop()  # the watch is down: nothing reports the deletion below
        cluster.kubectl("delete", "pod", "phantom", "-n", namespace, "--wait=true", timeout=90)
        assert gpus_used(cache.view(), node) == 2, "the stopped cache still holds the pod"

        cache.start()  # lists again and replaces the store, as after a 410
        eventually(lambda: node not in cache.view().usage, what="the phantom pod dropped")
        assert cache.pods.relists == 1


def test_forced_relist_keeps_what_exists(
    cluster: Cluster, namespace: str, cache: ClusterCache
) -> None:
    with node_pool(cluster, rack_sizes=(1,)) as pool:
        node = pool.nodes[0]
        apply(cluster, namespace, blocker_pod("stays", node, 1))
        eventually(lambda: gpus_used(cache.view(), node) == 1, what="the blocker's GPU")
        cache.force_relist()
        eventually(lambda: cache.pods.relists == 1 and cache.nodes.relists == 1, what="relists")
        assert gpus_used(cache.view(), node) == 1
        assert cache.stats()["pods"][1] == 1


def test_a_watch_the_server_ends_is_resumed_without_a_relist(
    cluster: Cluster, namespace: str, kube: KubeClient
) -> None:
    short = ClusterCache(kube, watch_seconds=1)  # the server closes each watch after 1 s
    short.start()
    try:
        assert short.wait_synced(30)
        with node_pool(cluster, rack_sizes=(1,)) as pool:
            node = pool.nodes[0]
            time.sleep(2.5)  # a couple of watches ended and resumed from their resourceVersion
            apply(cluster, namespace, blocker_pod("late", node, 4))
            eventually(lambda: gpus_used(short.view(), node) == 4, what="the blocker's 4 GPUs")
        assert short.pods.relists == 0
        assert short.nodes.relists == 0
        assert short.pods.errors == 0
    finally:
        short.stop()
