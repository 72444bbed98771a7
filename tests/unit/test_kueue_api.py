"""Kueue's API version: the operator's choice from what discovery lists, and that the
Workload cache and the Workload writes use the version chosen, for Kueue v0.11 to v0.14
(v1beta1 only), v0.15 and later (v1beta2 beside v1beta1) and none at all."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from kubernetes import client

from trainwave import contract
from trainwave.controller import kueue_api
from trainwave.controller.kueue_api import KueueNotServed, choose_version, discover_version
from trainwave.controller.workloads import (
    WorkloadCache,
    create_workload,
    patch_workload_status,
    set_workload_active,
)
from trainwave.lifecycle.admission import observe_workload

pytestmark = pytest.mark.timeout(10)


@pytest.mark.parametrize(
    ("served", "chosen"),
    [
        (["v1beta2", "v1beta1"], "v1beta2"),  # Kueue v0.15 to v0.17
        (["v1beta1", "v1beta2"], "v1beta2"),  # the order discovery lists them in does not matter
        (["v1beta1"], "v1beta1"),  # Kueue v0.11 to v0.14
        (["v1beta2"], "v1beta2"),  # a Kueue that no longer serves v1beta1
        (["v1beta1", "v1alpha1"], "v1beta1"),
    ],
    ids=["v0.17", "listed-reversed", "v0.11", "v1beta2-only", "with-alpha"],
)
def test_the_newest_version_trainwave_speaks_is_chosen(served: list[str], chosen: str) -> None:
    assert choose_version(served) == chosen


@pytest.mark.parametrize(
    ("served", "says"),
    [
        ([], "versions none (Kueue's CRDs are not installed)"),
        (["v1alpha1"], "versions v1alpha1;"),
        (["v1"], "versions v1;"),
    ],
    ids=["not-installed", "alpha-only", "unknown-newer"],
)
def test_no_version_trainwave_speaks_is_an_error_that_says_what_is_served(
    served: list[str], says: str
) -> None:
    with pytest.raises(KueueNotServed) as raised:
        choose_version(served)
    message = str(raised.value)
    assert says in message
    assert "speaks v1beta2 or v1beta1" in message
    assert "kueue.enabled=false" in message


def group(name: str, *versions: str) -> client.V1APIGroup:
    found = [
        client.V1GroupVersionForDiscovery(group_version=f"{name}/{v}", version=v) for v in versions
    ]
    return client.V1APIGroup(name=name, versions=found)


@pytest.mark.parametrize(
    ("groups", "chosen"),
    [
        ([group("batch", "v1"), group(contract.KUEUE_GROUP, "v1beta2", "v1beta1")], "v1beta2"),
        ([group(contract.KUEUE_GROUP, "v1beta1"), group("x.io", "v1beta2")], "v1beta1"),
    ],
    ids=["v0.17", "v0.11"],
)
def test_discovery_reads_only_kueues_group(
    monkeypatch: pytest.MonkeyPatch, groups: list[client.V1APIGroup], chosen: str
) -> None:
    listing = client.V1APIGroupList(groups=groups)
    monkeypatch.setattr(
        kueue_api.client, "ApisApi", lambda _: SimpleNamespace(get_api_versions=lambda: listing)
    )
    kube = SimpleNamespace(custom=SimpleNamespace(api_client=None))
    assert discover_version(kube) == chosen  # type: ignore[arg-type]


def test_discovery_without_kueue_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    listing = client.V1APIGroupList(groups=[group("batch", "v1")])
    monkeypatch.setattr(
        kueue_api.client, "ApisApi", lambda _: SimpleNamespace(get_api_versions=lambda: listing)
    )
    with pytest.raises(KueueNotServed, match="versions none"):
        discover_version(SimpleNamespace(custom=SimpleNamespace(api_client=None)))  # type: ignore[arg-type]


class Recorder:
    """The custom-objects calls made, with the group and version each addressed."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str, Any]] = []

    def __getattr__(self, method: str) -> Any:
        def call(group: str, version: str, *rest: Any, **_: Any) -> Any:
            self.calls.append((method, group, version, rest[-1] if rest else None))
            return SimpleNamespace(read=lambda: b"", release_conn=lambda: None)

        return call


@pytest.mark.parametrize("version", ["v1beta1", "v1beta2"])
def test_watches_and_writes_use_the_discovered_version(version: str) -> None:
    custom = Recorder()
    kube = SimpleNamespace(custom=custom, guard=lambda: None)
    workloads = WorkloadCache(kube, lambda key: None, version=version)  # type: ignore[arg-type]
    workloads.workload_informer._lister(limit=1)  # type: ignore[union-attr]
    workloads.flavor_informer._lister(limit=1)
    body = {"apiVersion": f"{contract.KUEUE_GROUP}/{contract.KUEUE_VERSION}",
            "metadata": {"name": "w", "namespace": "ns"}, "spec": {}}  # fmt: skip
    create_workload(kube, body, version=workloads.version)  # type: ignore[arg-type]
    set_workload_active(kube, "ns", "w", False, version=workloads.version)  # type: ignore[arg-type]
    patch_workload_status(kube, "ns", "w", "7", {"conditions": []}, version=workloads.version)  # type: ignore[arg-type]
    assert [(method, g, v) for method, g, v, _ in custom.calls] == [
        ("list_cluster_custom_object", contract.KUEUE_GROUP, version),
        ("list_cluster_custom_object", contract.KUEUE_GROUP, version),
        ("create_namespaced_custom_object", contract.KUEUE_GROUP, version),
        ("patch_namespaced_custom_object", contract.KUEUE_GROUP, version),
        ("patch_namespaced_custom_object_status", contract.KUEUE_GROUP, version),
    ]
    created = next(last for method, _, _, last in custom.calls if method.startswith("create"))
    assert created["apiVersion"] == f"{contract.KUEUE_GROUP}/{version}"


def admitted_workload(version: str, spec_extra: dict[str, Any]) -> dict[str, Any]:
    """An admitted Workload as the API server returns it at `version`: the fields trainwave
    reads, and the priority class fields each version names differently."""
    return {
        "apiVersion": f"{contract.KUEUE_GROUP}/{version}",
        "kind": "Workload",
        "metadata": {
            "name": "trainingjob-llm-1a2b3", "namespace": "ns", "resourceVersion": "9",
            "ownerReferences": [{"apiVersion": contract.API_VERSION, "kind": contract.KIND,
                                 "name": "llm", "uid": "uid-1"}],
        },
        "spec": {"queueName": "team-a", "priority": 5, "active": True, **spec_extra,
                 "podSets": [{"name": contract.KUEUE_POD_SET, "count": 2,
                              "template": {"spec": {"containers": []}}}]},
        "status": {
            "conditions": [{"type": "QuotaReserved", "status": "True"},
                           {"type": "Admitted", "status": "True"}],
            "admission": {"clusterQueue": "cq", "podSetAssignments": [
                {"name": contract.KUEUE_POD_SET, "count": 2,
                 "flavors": {"nvidia.com/gpu": "h100", "cpu": "default"}}]},
        },
    }  # fmt: skip


def test_a_workload_reads_the_same_in_both_versions() -> None:
    """The shapes compared in kueue_api.py's docstring, held: what decide sees of a
    Workload does not depend on the version it was read at."""
    v1beta1 = admitted_workload(
        "v1beta1", {"priorityClassSource": "kueue.x-k8s.io/workloadpriorityclass",
                    "priorityClassName": "high"},
    )  # fmt: skip
    v1beta2 = admitted_workload(
        "v1beta2", {"priorityClassRef": {"group": "kueue.x-k8s.io",
                                         "kind": "WorkloadPriorityClass", "name": "high"}},
    )  # fmt: skip
    old, new = observe_workload(v1beta1), observe_workload(v1beta2)
    assert old is not None
    assert old == new
    assert (old.admitted, old.cluster_queue, old.flavors) == (True, "cq", ("h100", "default"))
