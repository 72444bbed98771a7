"""A test kubelet: Nodes that kwok does not manage, whose pods run as real local processes.

    kubelet = TestKubelet(cluster.kubeconfig, workdir, nodes=2, venv=VENV)
    kubelet.start()          # the Nodes exist and are Ready
    ...                      # pods bound to kubelet.node_names run here
    kubelet.stop()           # processes killed, pods and Nodes deleted

It does what a kubelet does for trainwave's workers and no more: per node, a
watch on the pods bound to it; per pod, a `PodRun` (podrun.py) that runs the
init containers and containers as processes in the pod's own UTS, mount and
PID namespaces and reports their status; on deletion, SIGTERM, SIGKILL after
the grace period, then the final delete. Pod IPs are loopback addresses
127.0.0.N, one per pod. Every pod's /etc/hosts names the pod itself, as a
kubelet writes it, and, once a headless Service named like the pod's subdomain
exists in its namespace, its gang's live pods
(`<hostname>.<subdomain>[.<namespace>.svc.cluster.local]`): standing in for
that Service's DNS records, which do not exist before the Service does. A small HTTPS server
(logserver.py) serves the containers' output to the API server, so
`kubectl logs` and `trainwave logs` work on these pods. One thread handles
every event, so the kubelet's bookkeeping needs no locks.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from kubernetes import client, config, watch

from cluster.topology import NodeShape
from e2e.formats import hosts_file
from e2e.logserver import LogServer
from e2e.nodes import KUBELET_LABEL, NODE_IP, SHAPE, build_kubelet_node, delete_node, heartbeat
from e2e.podrun import Host, PodRun, force_delete
from e2e.volumes import MountPoints

logger = logging.getLogger(__name__)

HEARTBEAT_SECONDS = 10.0
WATCH_SECONDS = 5
DEFAULT_GRACE_SECONDS = 30
SERVICE_EVENT = "SERVICE_"  # marks a Service's watch event in the one event queue
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class AddressPool:
    """127.0.0.2-254, handed out round robin so a freed address is not reused at once."""

    def __init__(self) -> None:
        self._used: set[str] = set()
        self._next = 2

    def allocate(self) -> str:
        for _ in range(253):
            address = f"127.0.0.{self._next}"
            self._next = 2 if self._next == 254 else self._next + 1
            if address not in self._used:
                self._used.add(address)
                return address
        raise RuntimeError("all 253 loopback pod addresses 127.0.0.2-254 are in use")

    def release(self, address: str) -> None:
        self._used.discard(address)


class TestKubelet:
    __test__ = False  # not a pytest test class, despite the name

    def __init__(
        self,
        kubeconfig: Path,
        workdir: Path,
        *,
        venv: Path,
        nodes: int = 2,
        image_env: Mapping[str, str] | None = None,
        shape: NodeShape = SHAPE,
    ) -> None:
        self.id = f"k{uuid.uuid4().hex[:6]}"
        self.shape = shape
        self.node_names = [f"{self.id}-n{index}" for index in range(nodes)]
        api = config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
        self.core = client.CoreV1Api(api)
        self.leases = client.CoordinationV1Api(api)
        base_env = {
            # `python` in a container is this machine's venv: the stand-in for every image.
            "PATH": f"{venv}/bin:{SYSTEM_PATH}",
            "HOME": "/root",
            "LANG": "C.UTF-8",
            **(image_env or {}),
        }
        self.host = Host(self.core, workdir, base_env, MountPoints())
        self.runs: dict[str, PodRun] = {}  # by pod uid
        self.deleted: list[PodRun] = []  # kept for their logs
        self._events: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue()
        self._services: set[tuple[str, str]] = set()  # headless: (namespace, name)
        self._stopping = threading.Event()
        self._addresses = AddressPool()
        self._threads: list[threading.Thread] = []
        self.logs = LogServer(NODE_IP, workdir, self._newest_run)

    @property
    def selector(self) -> dict[str, str]:
        """A nodeSelector that matches exactly this kubelet's nodes."""
        return {KUBELET_LABEL: self.id}

    def start(self) -> None:
        self.logs.start()
        rack = f"{self.id}-rack"
        for position, name in enumerate(self.node_names):
            node = build_kubelet_node(
                name, self.id, rack=rack, position=position, log_port=self.logs.port,
                shape=self.shape,
            )  # fmt: skip
            self.core.create_node(node, _preload_content=False)
        for name in self.node_names:
            heartbeat(self.core, self.leases, name)
        self._spawn("kubelet-sync", self._sync_loop)
        self._spawn("kubelet-heartbeat", self._heartbeat_loop)
        for name in self.node_names:
            self._spawn(f"kubelet-watch-{name}", self._watch_loop, name)
        self._spawn("kubelet-watch-services", self._watch_loop, None)

    def stop(self) -> None:
        """Kill every pod's processes, force-delete its pods, delete its Nodes."""
        self._stopping.set()
        for thread in self._threads:
            thread.join(timeout=WATCH_SECONDS + 5)
        for run in self.runs.values():
            run.kill()
        for run in self.runs.values():
            run.finished.wait(timeout=10)
        for name in self.node_names:
            pods = self.core.list_pod_for_all_namespaces(
                field_selector=f"spec.nodeName={name}", _preload_content=False
            )
            for pod in _items(pods):
                meta = pod["metadata"]
                force_delete(self.core, meta["namespace"], meta["name"], meta["uid"])
            delete_node(self.core, self.leases, name)
        self.host.mountpoints.remove_all()
        self.logs.stop()

    def pod_runs(self, namespace: str, prefix: str = "") -> list[PodRun]:
        """The pods this kubelet ran in `namespace` whose names start with `prefix`."""
        runs = [*self.deleted, *self.runs.values()]
        return [r for r in runs if r.namespace == namespace and r.name.startswith(prefix)]

    def run_of(self, namespace: str, name: str) -> PodRun:
        found = [r for r in self.pod_runs(namespace) if r.name == name]
        if not found:
            raise KeyError(f"pod {namespace}/{name} never ran on {self.node_names}")
        return found[-1]

    def _newest_run(self, namespace: str, name: str) -> PodRun | None:
        # Called from the log server's threads: copy before reading what the sync thread changes.
        runs = [*list(self.deleted), *list(self.runs.values())]
        found = [r for r in runs if r.namespace == namespace and r.name == name]
        return found[-1] if found else None

    # --- threads ---------------------------------------------------------

    def _spawn(self, name: str, target: Any, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _heartbeat_loop(self) -> None:
        while not self._stopping.wait(HEARTBEAT_SECONDS):
            for name in self.node_names:
                try:
                    heartbeat(self.core, self.leases, name)
                except Exception:  # the next beat may well succeed; log and go on
                    logger.exception("heartbeat of node %s failed", name)

    def _watch_loop(self, node: str | None) -> None:
        """The pods bound to `node`; None: every namespace's Services, which the
        event is marked with (a SERVICE_ prefix)."""
        resume: list[str] = []  # the last resourceVersion seen, once there is one
        while not self._stopping.is_set():
            try:
                for kind, obj in self._watch(node, resume):
                    self._events.put((kind if node else SERVICE_EVENT + kind, obj))
            except Exception as error:  # 410 Gone, a dropped connection: list and watch anew
                logger.info(
                    "watch of %s restarts: %r", f"pods on {node}" if node else "services", error
                )
                resume.clear()
                self._stopping.wait(0.2)

    def _watch(self, node: str | None, resume: list[str]) -> Iterator[tuple[str, dict[str, Any]]]:
        """Events until the server ends the watch (WATCH_SECONDS), so stop() is heard."""
        if node is None:
            listing, selector = self.core.list_service_for_all_namespaces, {}
        else:
            listing = self.core.list_pod_for_all_namespaces
            selector = {"field_selector": f"spec.nodeName={node}"}
        stream = watch.Watch().stream(
            listing,
            **selector,
            resource_version=resume[0] if resume else None,
            timeout_seconds=WATCH_SECONDS,
            deserialize=False,
        )
        for event in stream:
            kind, obj = event["type"], event["object"]
            if kind in ("ADDED", "MODIFIED", "DELETED"):
                resume[:] = [obj["metadata"]["resourceVersion"]]
                yield kind, obj

    def _sync_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                kind, pod = self._events.get(timeout=0.5)
            except queue.Empty:
                continue
            try:
                self._sync(kind, pod)
            except Exception:
                logger.exception("sync of pod %s failed", pod["metadata"].get("name"))

    # --- the per-event decision --------------------------------------------

    def _sync(self, kind: str, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        if kind.startswith(SERVICE_EVENT):
            self._sync_service(kind.removeprefix(SERVICE_EVENT), pod)
            return
        run = self.runs.get(meta["uid"])
        deleting = meta.get("deletionTimestamp") is not None
        if kind == "DELETED":
            if run is not None:
                del self.runs[meta["uid"]]
                self.deleted.append(run)
                run.kill()
                self._addresses.release(run.ip)
                self._refresh_hosts(run.namespace)
            return
        if run is None:
            phase = (pod.get("status") or {}).get("phase")
            if deleting:
                # Nothing of it runs here: confirm the deletion at once.
                force_delete(self.core, meta["namespace"], meta["name"], meta["uid"])
            elif phase not in ("Succeeded", "Failed"):
                run = PodRun(self.host, pod, self._addresses.allocate())
                self.runs[meta["uid"]] = run
                self._refresh_hosts(run.namespace)
                run.start()
            return
        run.update(pod)
        if deleting:
            grace = meta.get("deletionGracePeriodSeconds")
            run.terminate(DEFAULT_GRACE_SECONDS if grace is None else int(grace))
        self._refresh_hosts(run.namespace)

    def _sync_service(self, kind: str, service: dict[str, Any]) -> None:
        meta = service["metadata"]
        key = (meta["namespace"], meta["name"])
        headless = (service.get("spec") or {}).get("clusterIP") == "None"
        if kind == "DELETED" or not headless:
            self._services.discard(key)
        else:
            self._services.add(key)
        self._refresh_hosts(meta["namespace"])

    def _refresh_hosts(self, namespace: str) -> None:
        """Rewrite the hosts files of the namespace's pods: each names its live peers,
        once their Service exists.

        Like the Service's endpoints, a peer that finished or is being deleted is
        left out, so a restarted gang's names resolve to its new pods only.
        """
        runs = [r for r in self.runs.values() if r.namespace == namespace]
        live = [r.address for r in runs if r.live]
        for run in runs:
            subdomain = run.address.subdomain
            served = bool(subdomain) and (namespace, subdomain) in self._services
            peers = [a for a in live if served and a.subdomain == subdomain]
            names_peers = any(a != run.address for a in peers)
            run.write_hosts(hosts_file(run.address, peers), names_peers=names_peers)


def _items(response: Any) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = json.loads(response.data)["items"]
    return items
