"""A worker's Events, as the operator lists them through its own ServiceAccount (the chart
grants `list` on events, no watch): only the Events on that pod, by its UID, and the
newest says why it waits. The Events are written as a kubelet writes them (core API,
`source.component: kubelet`); the pod is held by a scheduling gate, so nothing else acts
on it."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes import config

from cluster.controlplane import Cluster
from cluster.deploy import service_account_kubeconfig
from integration.trainwave_fixtures import apply, get_json
from trainwave.controller.kube import KubeClient
from trainwave.lifecycle.sitting import explaining_event

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def kube(trainwave_installed: Cluster, tmp_path: Path) -> KubeClient:
    kubeconfig = service_account_kubeconfig(trainwave_installed, tmp_path / "kubeconfig")
    return KubeClient(config.new_client_from_config(str(kubeconfig)))


def held_pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "schedulingGates": [{"name": "example.com/held"}],
            "containers": [{"name": "worker", "image": "worker:1"}],
        },
    }


def kubelet_event(
    name: str, pod: dict[str, Any], kind: str, reason: str, message: str
) -> dict[str, Any]:
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    meta = pod["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": meta["name"],
                           "namespace": meta["namespace"], "uid": meta["uid"]},
        "type": kind,
        "reason": reason,
        "message": message,
        "source": {"component": "kubelet", "host": "node-0"},
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }  # fmt: skip


def test_only_the_events_on_that_pod_are_listed_and_the_newest_explains(
    trainwave_installed: Cluster, namespace: str, kube: KubeClient
) -> None:
    cluster = trainwave_installed
    apply(cluster, namespace, held_pod("w-0"), held_pod("w-1"))
    mine = get_json(cluster, namespace, "pod", "w-0")
    other = get_json(cluster, namespace, "pod", "w-1")
    mount = 'MountVolume.SetUp failed for volume "cfg" : configmap "cfg" not found'
    apply(
        cluster,
        namespace,
        kubelet_event("w-0.scheduled", mine, "Normal", "Scheduled", "assigned to node-0"),
        kubelet_event("w-1.sandbox", other, "Warning", "FailedCreatePodSandBox", "cni failed"),
    )
    # Written after the others: the newest, whatever the second they share.
    apply(cluster, namespace, kubelet_event("w-0.mount", mine, "Warning", "FailedMount", mount))

    events = kube.pod_events(namespace, mine["metadata"]["uid"])

    assert sorted(e["metadata"]["name"] for e in events) == ["w-0.mount", "w-0.scheduled"]
    assert explaining_event(events, datetime.now(UTC)) == f"FailedMount: {mount}"
    assert kube.pod_events(namespace, "no-such-uid") == []
