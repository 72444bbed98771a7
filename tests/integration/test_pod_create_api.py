"""A worker pod's create as the API server answers it, through the operator's own
ServiceAccount (its role lists pods but cannot get one): a 409 for a pod the job owns
already is the watch behind and passes quietly; a 409 for anyone else's pod is Refused,
naming the holder. The pods are owned by a ConfigMap and held by a scheduling gate, so no
operator or scheduler acts on them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kubernetes import config

from cluster.controlplane import Cluster
from cluster.deploy import service_account_kubeconfig
from integration.trainwave_fixtures import get_json
from trainwave.controller.api_errors import Refused
from trainwave.controller.kube import KubeClient

pytestmark = pytest.mark.timeout(120)


def owner(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    cluster.kubectl("create", "configmap", name, "-n", namespace)
    uid = get_json(cluster, namespace, "configmap", name)["metadata"]["uid"]
    return {"apiVersion": "v1", "kind": "ConfigMap", "name": name, "uid": uid, "controller": True}


def pod(namespace: str, name: str, owners: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "ownerReferences": owners},
        "spec": {
            "schedulingGates": [{"name": "example.com/held"}],
            "containers": [{"name": "worker", "image": "worker:1"}],
        },
    }


@pytest.fixture
def kube(trainwave_installed: Cluster, tmp_path: Path) -> KubeClient:
    """The client as the operator's ServiceAccount, so its role is what is exercised."""
    kubeconfig = service_account_kubeconfig(trainwave_installed, tmp_path / "kubeconfig")
    return KubeClient(config.new_client_from_config(str(kubeconfig)))


def test_a_pod_created_twice_by_its_owner_is_left_alone(
    trainwave_installed: Cluster, namespace: str, kube: KubeClient
) -> None:
    cluster = trainwave_installed
    mine = pod(namespace, "w-0", [owner(cluster, namespace, "job")])
    kube.create_pod(mine)
    uid = get_json(cluster, namespace, "pod", "w-0")["metadata"]["uid"]

    kube.create_pod(mine)  # the watch behind: a 409, and the pod is ours

    assert get_json(cluster, namespace, "pod", "w-0")["metadata"]["uid"] == uid


def test_a_pod_of_that_name_owned_by_another_is_refused_naming_it(
    trainwave_installed: Cluster, namespace: str, kube: KubeClient
) -> None:
    cluster = trainwave_installed
    theirs = owner(cluster, namespace, "other")
    kube.create_pod(pod(namespace, "w-1", [theirs]))
    kube.create_pod(pod(namespace, "w-2", []))

    mine = [owner(cluster, namespace, "job")]
    with pytest.raises(Refused, match=f"owned by ConfigMap other \\(uid {theirs['uid']}\\)"):
        kube.create_pod(pod(namespace, "w-1", mine))
    with pytest.raises(Refused, match="owned by nothing; created once the name is free"):
        kube.create_pod(pod(namespace, "w-2", mine))
