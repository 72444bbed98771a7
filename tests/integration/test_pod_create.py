"""How the operator creates a worker pod (controller/kube.py KubeClient.create_pod), against
the real API server: a create whose pod exists already counts as done only when the same
owner made it and it is not going away; anything else is a Conflict, and a pod the API
server cannot take is Rejected, naming why."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import config

from cluster.controlplane import Cluster
from integration.trainwave_fixtures import get_json
from trainwave.controller.kube import Conflict, KubeClient, Rejected

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

HOLD = "example.com/hold"  # a gate of nobody's: nothing schedules these pods
KEEP = "example.com/keep"  # a finalizer of nobody's: a deleted pod stays terminating


@pytest.fixture
def kube(cluster: Cluster) -> KubeClient:
    return KubeClient(config.new_client_from_config(str(cluster.kubeconfig)))


@pytest.fixture
def owners(cluster: Cluster, namespace: str) -> Iterator[list[tuple[str, str]]]:
    """Two ConfigMaps (name, UID), standing in for two TrainingJobs that no operator acts
    on; real ones, or the garbage collector deletes the pods as orphans."""
    found = []
    for name in ("owner-a", "owner-b"):
        cluster.kubectl("create", "configmap", name, "-n", namespace)
        found.append((name, get_json(cluster, namespace, "configmap", name)["metadata"]["uid"]))
    yield found
    pod = get_json(cluster, namespace, "pods")["items"]
    for item in pod:  # let a pod kept terminating go
        if item["metadata"].get("finalizers"):
            cluster.kubectl("patch", "pod", item["metadata"]["name"], "-n", namespace,
                            "--type=merge", "-p", '{"metadata":{"finalizers":null}}')  # fmt: skip


def pod(
    namespace: str, owner: tuple[str, str], name: str = "worker-0", **extra: Any
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "ConfigMap", "name": owner[0], "uid": owner[1],
                 "controller": True}
            ],
            **extra,
        },
        "spec": {
            "schedulingGates": [{"name": HOLD}],
            "containers": [{"name": "worker", "image": "busybox"}],
        },
    }  # fmt: skip


def test_a_create_repeated_for_the_same_owner_is_done(
    kube: KubeClient, cluster: Cluster, namespace: str, owners: list[tuple[str, str]]
) -> None:
    kube.create_pod(pod(namespace, owners[0]))
    kube.create_pod(pod(namespace, owners[0]))  # its answer lost, or decided twice: done
    listed = cluster.kubectl("get", "pods", "-n", namespace, "-o", "json", "--show-managed-fields")
    [only] = json.loads(listed.stdout)["items"]
    assert only["metadata"]["ownerReferences"][0]["uid"] == owners[0][1]
    [managed] = only["metadata"]["managedFields"]
    assert (managed["manager"], managed["operation"]) == ("trainwave", "Update"), "a create"


def test_a_pod_of_another_owner_under_the_name_is_a_conflict(
    kube: KubeClient, namespace: str, owners: list[tuple[str, str]]
) -> None:
    kube.create_pod(pod(namespace, owners[0]))
    with pytest.raises(Conflict, match=re.escape(f"belongs to another owner ({owners[0][1]})")):
        kube.create_pod(pod(namespace, owners[1]))


def test_a_terminating_pod_of_the_same_owner_is_a_conflict(
    kube: KubeClient, cluster: Cluster, namespace: str, owners: list[tuple[str, str]]
) -> None:
    """A replaced worker's new pod has its old pod's name: created only once that is gone."""
    kube.create_pod(pod(namespace, owners[0], finalizers=[KEEP]))
    cluster.kubectl("delete", "pod", "worker-0", "-n", namespace, "--wait=false")
    with pytest.raises(Conflict, match="terminating"):
        kube.create_pod(pod(namespace, owners[0]))


def test_a_pod_the_api_server_cannot_take_is_rejected_with_its_reason(
    kube: KubeClient, namespace: str, owners: list[tuple[str, str]]
) -> None:
    bad = pod(namespace, owners[0])
    bad["spec"]["containers"][0]["name"] = "Not_A_DNS_Label"
    with pytest.raises(Rejected, match=re.escape("spec.containers[0].name")):
        kube.create_pod(bad)
