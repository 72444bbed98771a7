"""The small cluster the kube-apiserver cost diagnostics run on (crd_write_cost.py,
pod_write_cost.py): its own state directory, an admin client, the API server's pid for
/proc, and the namespace the writes go to; stopped afterwards unless kept."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from benchmarks.provenance import git_commit
from cluster.api import ApiClient, ApiError
from cluster.components import Layout
from cluster.controlplane import ensure_cluster, stop_cluster

TOPOLOGY = Path(__file__).resolve().parents[1] / "cluster" / "topologies" / "small.yaml"


@contextmanager
def apiserver_cluster(
    state_dir: Path, namespace: str, *, keep: bool
) -> Iterator[tuple[ApiClient, int]]:
    """(client, kube-apiserver pid) on a running small cluster with `namespace` in it."""
    cluster = ensure_cluster(TOPOLOGY, state_dir)
    layout = Layout(cluster.state_dir)
    api = ApiClient(cluster.server, layout.pki, timeout=60)
    state = json.loads(layout.state_file.read_text())
    apiserver = next(p["pid"] for p in state["processes"] if p["name"] == "kube-apiserver")
    try:
        try:
            api.request("POST", "/api/v1/namespaces", {"metadata": {"name": namespace}})
        except ApiError as error:
            if error.status != 409:
                raise
        yield api, apiserver
    finally:
        api.close()
        if not keep:
            stop_cluster(state_dir)


def common_conditions() -> dict[str, str]:
    """What every run of these diagnostics shares: when, which commit, where, which client."""
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": git_commit(),
        "cluster": "tests/cluster/topologies/small.yaml (9 nodes), nothing else writing",
        "client": "the admin client certificate, one request at a time",
    }


def conditions_lines(conditions: dict[str, object]) -> list[str]:
    """The report's closing list of conditions."""
    return ["", "Conditions:", *(f"- {key}: {value}" for key, value in conditions.items())]
