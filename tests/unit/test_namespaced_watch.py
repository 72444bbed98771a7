"""Namespaces are filtered at the watch: with --namespace names, every LIST and WATCH
the jobs cache sends goes to that namespace's endpoint (controller-runtime's
multiNamespaceCache), never the cluster-wide one. Checked on the URLs the official
client builds, with only its transport replaced."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
from kubernetes.client import ApiClient, Configuration

from trainwave.controller.job_cache import JobCache
from trainwave.controller.kube import KubeClient
from unit.test_cluster_cache import FakeResponse, until

pytestmark = pytest.mark.timeout(20)


class RecordingClient(ApiClient):
    """The official client down to the request; each request's path and query are kept
    and answered: a LIST with an empty page at resourceVersion 7, a WATCH that idles."""

    def __init__(self) -> None:
        super().__init__(Configuration(host="http://127.0.0.1:9"))  # never dialled
        self.requests: list[tuple[str, dict[str, list[str]]]] = []

    def call_api(self, method: str, url: str, *_: Any, **__: Any) -> Any:
        parsed = urlparse(url)
        query = parse_qs(parsed.query)
        self.requests.append((parsed.path, query))
        if query.get("watch") == ["true"]:
            return SimpleNamespace(status=200, response=FakeResponse(hold=True))
        page = {"items": [], "metadata": {"resourceVersion": "7"}}
        return SimpleNamespace(status=200, response=FakeResponse(json.dumps(page).encode()))

    def paths(self, watch: bool) -> set[str]:
        return {path for path, q in self.requests if (q.get("watch") == ["true"]) == watch}


def watched_paths(namespaces: tuple[str, ...]) -> RecordingClient:
    client = RecordingClient()
    cache = JobCache(KubeClient(client), lambda key: None, namespaces=namespaces)
    cache.start()
    try:
        assert cache.wait_synced(5)
        until(lambda: len(client.paths(watch=True)) == 3 * max(1, len(namespaces)))
    finally:
        cache.stop()
    return client


def test_named_namespaces_are_listed_and_watched_only_at_their_own_endpoints() -> None:
    client = watched_paths(("team-x", "team-y"))
    expected = {
        f"{prefix}/namespaces/{namespace}/{plural}"
        for namespace in ("team-x", "team-y")
        for prefix, plural in (
            ("/apis/trainwave.io/v1alpha1", "trainingjobs"),
            ("/api/v1", "pods"),
            ("/apis/discovery.k8s.io/v1", "endpointslices"),
        )
    }
    assert client.paths(watch=False) == expected
    assert client.paths(watch=True) == expected
    for path, query in client.requests:
        if query.get("watch") == ["true"]:
            # Each watch resumes from its own namespace's LIST, with bookmarks.
            assert query["resourceVersion"] == ["7"], path
            assert query["allowWatchBookmarks"] == ["true"], path


def test_a_namespace_pattern_names_no_endpoint_so_it_is_watched_cluster_wide() -> None:
    client = watched_paths(("team-*",))
    expected = {
        "/apis/trainwave.io/v1alpha1/trainingjobs",
        "/api/v1/pods",
        "/apis/discovery.k8s.io/v1/endpointslices",
    }
    assert client.paths(watch=True) == expected


def test_no_namespaces_means_the_cluster_wide_endpoints() -> None:
    client = watched_paths(())
    assert client.paths(watch=False) == {
        "/apis/trainwave.io/v1alpha1/trainingjobs",
        "/api/v1/pods",
        "/apis/discovery.k8s.io/v1/endpointslices",
    }
