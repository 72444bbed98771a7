"""Restart one component of a running local cluster, as a crashed process comes back.

The faults behind watch gaps (tests/integration/test_watch_gap.py) and the chaos suite
(tests/chaos): the component is stopped (SIGTERM, then SIGKILL after a grace) and started
again with the ports, flags and state `controlplane._start` gave it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cluster import components, processes
from cluster.api import ApiClient, ApiError
from cluster.components import Layout, Ports
from cluster.controlplane import (
    STAGES,
    START_TIMEOUT,
    STOP_GRACE,
    _environment,
    _http_ok,
    _locked,
    _read_state,
    _ready,
    _wait_until,
    _write_state,
    default_state_dir,
    tool,
)
from cluster.topology import KWOK_NODE_ANNOTATION, KWOK_NODE_VALUE

RESYNC_ANNOTATION = "sim.trainwave.io/kwok-resync"


def restart_api_server(state_dir: Path | None = None, timeout: float = START_TIMEOUT) -> None:
    """Stop kube-apiserver and start it again on the same port, flags and etcd.

    Its watch cache starts over at etcd's current revision, so a client resuming a
    watch from an older resourceVersion gets 410 Gone and must relist: the fault
    behind watch gaps. Every open connection to it breaks on the way.
    """
    restart_component("kube-apiserver", state_dir, timeout)


def restart_component(
    name: str, state_dir: Path | None = None, timeout: float = START_TIMEOUT
) -> None:
    """Stop one component (kube-apiserver or kwok) and start it again with the same ports,
    flags and state, as a crashed and restarted process would be; wait until it serves.

    kwok keeps nothing of its own: on start it lists the nodes and pods it manages and
    plays their stages from what the API server holds, so a pod's simulated run keeps
    counting from its status.startTime across the restart.
    """
    layout = Layout((state_dir or default_state_dir()).resolve())
    with _locked(layout):
        state = _read_state(layout)
        if state is None:
            raise RuntimeError(f"no cluster runs in {layout.root}")
        records = state["processes"]
        index = next(i for i, r in enumerate(records) if r["name"] == name)
        processes.stop_groups([records[index]["pid"]], STOP_GRACE)
        released = _release_node_leases(layout, state) if name == "kwok" else 0
        ports = Ports(**state["ports"])
        command, environment, check = _restartable(name, layout, state, ports)
        record = processes.spawn(name, command, layout.log(name), layout.root, environment)
        records[index] = record.to_json()
        _write_state(layout, state)
        deadline = time.monotonic() + timeout
        _wait_until(layout, state, deadline, f"{name} serving again", check)
        if released:  # serving is not playing: wait until it holds its nodes again
            _wait_until(
                layout, state, deadline, f"kwok to hold {released} node Leases",
                lambda: len(_kwok_leases(layout, state)) >= released,
            )  # fmt: skip
            _resync_kwok_pods(layout, state)


def _release_node_leases(layout: Layout, state: dict[str, Any]) -> int:
    """Hand the node Leases of a stopped kwok to the next one.

    A kubelet holds its node's Lease under the node's name, so a restarted kubelet renews
    it at once. kwok holds them under a per-process id, and a new kwok waits a whole
    lease duration (120 s here; more above 1,024 nodes) before it takes them over, playing
    no pod meanwhile: not a restart but a two-minute outage of every node. Deleting the
    Leases of the process that is gone lets the new one create them afresh, as a
    restarted kubelet would renew.
    """
    held = _kwok_leases(layout, state)
    client = ApiClient(state["server"], layout.pki, timeout=10)
    try:
        for name in held:
            with contextlib.suppress(ApiError):
                client.request("DELETE", f"{_NODE_LEASES}/{name}")
    finally:
        client.close()
    return len(held)


_NODE_LEASES = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"


def _kwok_leases(layout: Layout, state: dict[str, Any]) -> list[str]:
    """Node Leases held by kwok: under a process id, where a kubelet uses its node's name.
    Only of nodes that exist: the Lease of a deleted node lingers, and no kwok renews it."""
    client = ApiClient(state["server"], layout.pki, timeout=10)
    try:
        items = client.get(_NODE_LEASES)["items"]
        nodes = {n["metadata"]["name"] for n in client.get("/api/v1/nodes")["items"]}
    finally:
        client.close()
    return [
        lease["metadata"]["name"] for lease in items
        if lease["metadata"]["name"] in nodes
        and lease["spec"].get("holderIdentity") not in (None, "", lease["metadata"]["name"])
    ]  # fmt: skip


def _restartable(
    name: str, layout: Layout, state: dict[str, Any], ports: Ports
) -> tuple[list[str], dict[str, str], Callable[[], bool]]:
    """The command, environment and readiness check `_start` uses for `name`."""
    environment = _environment()
    if name == "kube-apiserver":
        command = components.apiserver_command(
            tool("kube-apiserver"),
            layout,
            ports,
            audit=bool(state.get("audit_users")),
            node_host=state.get("node_host", ""),
        )

        def ready() -> bool:
            client = ApiClient(state["server"], layout.pki, timeout=5)
            try:
                return _ready(client)
            finally:
                client.close()

        return command, environment, ready
    if name == "kwok":
        lease_seconds = state.get("node_lease_seconds", components.NODE_LEASE_SECONDS)
        command = components.kwok_command(tool("kwok"), layout, ports, STAGES, lease_seconds)
        healthz = f"http://127.0.0.1:{ports.kwok}/healthz"
        return command, components.kwok_environment(layout, environment), lambda: _http_ok(healthz)
    raise ValueError(f"restarting {name!r} is not supported; only kube-apiserver and kwok")


def _resync_kwok_pods(layout: Layout, state: dict[str, Any]) -> None:
    """Touch every pod bound to a kwok node, so the new kwok plays it.

    A restarted kubelet syncs all of its pods from the API server. A new kwok plays a
    pod only on an event that arrives once it manages the pod's node; the pods it listed
    before it held the node's Lease are never played again (seen: Running pods whose
    run-for had passed, never finished). An annotation bump is that event; nothing that
    trainwave reads changes.
    """
    client = ApiClient(state["server"], layout.pki, timeout=10)
    stamp = {"metadata": {"annotations": {RESYNC_ANNOTATION: str(time.time_ns())}}}
    try:
        nodes = {
            n["metadata"]["name"] for n in client.get("/api/v1/nodes")["items"]
            if (n["metadata"].get("annotations") or {}).get(KWOK_NODE_ANNOTATION)
            == KWOK_NODE_VALUE
        }  # fmt: skip
        for pod in client.get("/api/v1/pods")["items"]:
            meta = pod["metadata"]
            if pod["spec"].get("nodeName") not in nodes:
                continue
            path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"
            with contextlib.suppress(ApiError):  # gone meanwhile
                client.request("PATCH", path, stamp, "application/merge-patch+json")
    finally:
        client.close()
