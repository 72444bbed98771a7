"""Make the cluster's kwok nodes match a topology, and wait until they are Ready.

Nodes are created with their status in the same request (the API server keeps
`status` on Node create), from a small thread pool: 1,024 nodes take seconds,
not minutes. A node whose labels or capacity drifted from the topology is
deleted and created again, so `up` also repairs what a test changed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from fractions import Fraction
from typing import Any
from urllib.parse import quote

from cluster.api import ApiClient, ApiError
from cluster.topology import KWOK_NODE_TYPE, KWOK_NODE_TYPE_LABEL

WORKERS = 8
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
_KWOK_NODES = f"/api/v1/nodes?labelSelector={quote(f'{KWOK_NODE_TYPE_LABEL}={KWOK_NODE_TYPE}')}"


@dataclass(frozen=True)
class NodeChanges:
    created: int
    replaced: int
    deleted: int
    unchanged: int


def apply_nodes(client: ApiClient, desired: Sequence[dict[str, Any]]) -> NodeChanges:
    """Create missing nodes, replace drifted ones, delete kwok nodes not in `desired`."""
    existing = {node["metadata"]["name"]: node for node in client.get(_KWOK_NODES)["items"]}
    wanted = {node["metadata"]["name"]: node for node in desired}
    extra = [name for name in existing if name not in wanted]
    drifted = [
        name for name, node in wanted.items() if name in existing and _drifted(node, existing[name])
    ]
    missing = [name for name in wanted if name not in existing]

    _parallel(lambda name: _delete(client, name), [*extra, *drifted])
    _wait_gone(client, [*extra, *drifted])
    _parallel(lambda name: _create(client, wanted[name]), [*missing, *drifted])
    return NodeChanges(
        created=len(missing),
        replaced=len(drifted),
        deleted=len(extra),
        unchanged=len(wanted) - len(missing) - len(drifted),
    )


def wait_nodes_ready(client: ApiClient, names: Iterable[str], timeout: float) -> None:
    """Until every named node is Ready and the node controller lifted its not-ready taint."""
    waiting = set(names)
    deadline = time.monotonic() + timeout
    while True:
        for node in client.get(_KWOK_NODES)["items"]:
            if _schedulable(node):
                waiting.discard(node["metadata"]["name"])
        if not waiting:
            return
        if time.monotonic() > deadline:
            sample = ", ".join(sorted(waiting)[:5])
            raise TimeoutError(
                f"{len(waiting)} node(s) not Ready and untainted after {timeout:.0f}s "
                f"(e.g. {sample}); see the kwok and kube-controller-manager logs"
            )
        time.sleep(0.25)


def _schedulable(node: dict[str, Any]) -> bool:
    conditions = node.get("status", {}).get("conditions") or []
    ready = any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
    taints = node.get("spec", {}).get("taints") or []
    return ready and not any(t["key"] == NOT_READY_TAINT for t in taints)


def _drifted(wanted: dict[str, Any], actual: dict[str, Any]) -> bool:
    labels = actual["metadata"].get("labels") or {}
    # Extra labels are fine: the agent or a test may add its own.
    if any(labels.get(key) != value for key, value in wanted["metadata"]["labels"].items()):
        return True
    status = actual.get("status") or {}
    for field in ("capacity", "allocatable"):
        want = {k: _quantity(v) for k, v in wanted["status"][field].items()}
        have = {k: _quantity(v) for k, v in (status.get(field) or {}).items()}
        if want != have:
            return True
    return False


# The server stores quantities in canonical form ("1000" comes back as "1k"),
# so they are compared by value.
_SUFFIXES: dict[str, int | Fraction] = {
    "": 1, "m": Fraction(1, 1000), "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
    "P": 10**15, "E": 10**18, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40,
    "Pi": 2**50, "Ei": 2**60,
}  # fmt: skip


def _quantity(text: str) -> Fraction | str:
    number = text.rstrip("kmMGTPEi")
    try:
        return Fraction(number) * _SUFFIXES[text[len(number) :]]
    except (ValueError, KeyError):
        return text


def _create(client: ApiClient, node: dict[str, Any]) -> None:
    client.request("POST", "/api/v1/nodes", node)


def _delete(client: ApiClient, name: str) -> None:
    try:
        client.request("DELETE", f"/api/v1/nodes/{name}")
    except ApiError as error:
        if error.status != 404:
            raise


def _wait_gone(client: ApiClient, names: Sequence[str], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    pending = set(names)
    while pending and time.monotonic() < deadline:
        present = {node["metadata"]["name"] for node in client.get(_KWOK_NODES)["items"]}
        pending &= present
        if pending:
            time.sleep(0.2)
    if pending:
        raise TimeoutError(
            f"nodes still present {timeout:.0f}s after delete: {sorted(pending)[:5]}"
        )


def _parallel(action: Callable[[str], None], names: Sequence[str]) -> None:
    if not names:
        return
    with ThreadPoolExecutor(max_workers=min(WORKERS, len(names))) as pool:
        # list() re-raises the first failure here rather than dropping it.
        list(pool.map(action, names))
