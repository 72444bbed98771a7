"""What the API server saw while operators were killed or replaced, from watches the test
starts before anything happens: every pod name and uid that ever existed, the GPUs promised
on each node at every step, every phase each job passed through.

A watch delivers a namespace's changes in resourceVersion order, so the state after each
event is a state the cluster really was in: a GPU promised twice shows up even if it lasts
one event.
"""

from __future__ import annotations

import json
import threading
import time
from collections import defaultdict
from typing import Any

from kubernetes import client, config, watch

from cluster.controlplane import Cluster
from trainwave import contract

PLACED_NODE = contract.ANNOTATION_PLACED_NODE
GATE = contract.SCHEDULING_GATE
GPU = "nvidia.com/gpu"


def api_client(cluster: Cluster) -> client.ApiClient:
    return config.new_client_from_config(str(cluster.kubeconfig))  # type: ignore[no-any-return]


class Ledger:
    """A watch in a thread; `stop()` ends it. Subclasses record what they need per event."""

    def __init__(self, cluster: Cluster, namespace: str):
        self._api = api_client(cluster)
        self._namespace = namespace
        self._watch = watch.Watch()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._stopping = threading.Event()
        self.errors: list[str] = []
        self.restarts: list[str] = []
        self.relist_on_gone = False  # a 410 is an error unless the test expects gaps
        self.relists = 0

    def start(self) -> Ledger:
        self._thread.start()
        assert self._ready.wait(30), "watch did not start"
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._watch.stop()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        version = self._relist()
        self._ready.set()
        while not self._stopping.is_set():
            try:
                stream = self._watch.stream(
                    self._list, resource_version=version, timeout_seconds=600
                )
                for event in stream:
                    body = event["raw_object"]
                    if event["type"] == "ERROR":  # 410 Gone: events were lost, say so
                        self.errors.append(f"watch error: {body.get('message')}")
                        return
                    version = body["metadata"]["resourceVersion"]
                    self.record(event["type"], body)
            except Exception as error:
                # A dropped connection loses nothing: the watch resumes from the last
                # resourceVersion it delivered.
                if self._stopping.is_set():
                    return
                time.sleep(0.2)
                self.restarts.append(repr(error))
                if getattr(error, "status", None) == 410:
                    if not self.relist_on_gone:
                        self.errors.append(f"watch error: {error}")
                        return
                    # A restarted API server's watch cache starts at etcd's current
                    # revision: the history is gone, only a fresh list is the truth.
                    # What was created and deleted in the gap is missed; `relists` says
                    # how many gaps there were.
                    version = self._relist_after_gap()

    def _relist(self) -> str:
        listing = self._list(_request_timeout=30)
        for item in listing["items"]:
            self.record("ADDED", item)
        return str(listing["metadata"]["resourceVersion"])

    def _relist_after_gap(self) -> str:
        while True:
            try:
                listing = self._list(_request_timeout=30)
                break
            except Exception as error:  # the server may still be starting
                if self._stopping.is_set():
                    raise
                self.restarts.append(repr(error))
                time.sleep(0.5)
        self.relists += 1
        self.resync(listing["items"])
        return str(listing["metadata"]["resourceVersion"])

    def resync(self, items: list[dict[str, Any]]) -> None:
        """A fresh list after a gap; subclasses drop what it no longer holds."""
        for item in items:
            self.record("ADDED", item)

    def _list(self, **kwargs: Any) -> Any:
        raise NotImplementedError

    def record(self, kind: str, body: dict[str, Any]) -> None:
        raise NotImplementedError


class PodLedger(Ledger):
    """Pods of one namespace: names and uids ever seen; GPUs promised per node, checked at
    every event against each node's capacity."""

    def __init__(self, cluster: Cluster, namespace: str, gpus_per_node: int):
        super().__init__(cluster, namespace)
        self.core = client.CoreV1Api(self._api)
        self.capacity = gpus_per_node
        self.uids: dict[str, set[str]] = defaultdict(set)  # pod name -> every uid it had
        self.live: dict[str, dict[str, Any]] = {}
        self.peak: dict[str, int] = defaultdict(int)

    def _list(self, **kwargs: Any) -> Any:
        if "watch" in kwargs:
            return self.core.list_namespaced_pod(self._namespace, **kwargs)
        # Plain dicts, like the watch's raw objects, not client models.
        response = self.core.list_namespaced_pod(self._namespace, _preload_content=False, **kwargs)
        return json.loads(response.data)

    def resync(self, items: list[dict[str, Any]]) -> None:
        names = {item["metadata"]["name"] for item in items}
        for gone in set(self.live) - names:
            self.live.pop(gone)
        super().resync(items)

    def record(self, kind: str, body: dict[str, Any]) -> None:
        name = body["metadata"]["name"]
        self.uids[name].add(body["metadata"]["uid"])
        if kind == "DELETED":
            self.live.pop(name, None)
        else:
            self.live[name] = body
        promised: dict[str, int] = defaultdict(int)
        for pod in self.live.values():
            node = _promised_node(pod)
            if node:
                promised[node] += _gpus(pod)
        for node, gpus in promised.items():
            self.peak[node] = max(self.peak[node], gpus)
            if gpus > self.capacity:
                holders = sorted(p for p, pod in self.live.items() if _promised_node(pod) == node)
                self.errors.append(f"{node}: {gpus} GPUs promised of {self.capacity}: {holders}")


class JobLedger(Ledger):
    """TrainingJobs of one namespace: the phases each passed through, in order."""

    def __init__(self, cluster: Cluster, namespace: str):
        super().__init__(cluster, namespace)
        self.custom = client.CustomObjectsApi(self._api)
        self.phases: dict[str, list[str]] = defaultdict(list)

    def _list(self, **kwargs: Any) -> Any:
        return self.custom.list_namespaced_custom_object(
            "trainwave.io", "v1alpha1", self._namespace, "trainingjobs", **kwargs
        )

    def record(self, kind: str, body: dict[str, Any]) -> None:
        phase = (body.get("status") or {}).get("phase") or "-"
        seen = self.phases[body["metadata"]["name"]]
        if not seen or seen[-1] != phase:
            seen.append(phase)


def _promised_node(pod: dict[str, Any]) -> str | None:
    """The node a pod holds GPUs on: bound, or pinned by the placer and released from the
    gate; a finished pod holds nothing."""
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return None
    spec = pod.get("spec") or {}
    if spec.get("nodeName"):
        return str(spec["nodeName"])
    if any(g.get("name") == GATE for g in spec.get("schedulingGates") or []):
        return None
    node = (pod["metadata"].get("annotations") or {}).get(PLACED_NODE)
    return str(node) if node else None


def _gpus(pod: dict[str, Any]) -> int:
    total = 0
    for container in (pod.get("spec") or {}).get("containers") or []:
        limits = (container.get("resources") or {}).get("limits") or {}
        total += int(limits.get(GPU, 0))
    return total
