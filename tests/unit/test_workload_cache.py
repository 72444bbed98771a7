"""The Workload cache without a cluster: which job a Workload is filed under, what wakes
that job, and that a Workload of an earlier job of the same name is not the current one's."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace
from typing import Any

import pytest

from trainwave import contract
from trainwave.controller.workloads import WorkloadCache

pytestmark = pytest.mark.timeout(10)


def raw_workload(
    name: str, job: str = "llm", uid: str = "uid-1", version: str = "1", admitted: bool = False
) -> dict[str, Any]:
    conditions = [{"type": "QuotaReserved", "status": "True" if admitted else "False"}]
    return {
        "metadata": {
            "name": name, "namespace": "ns", "resourceVersion": version,
            "labels": {contract.LABEL_JOB_NAME: job},
            "ownerReferences": [{"apiVersion": contract.API_VERSION, "kind": contract.KIND,
                                 "name": job, "uid": uid}],
        },
        "spec": {"queueName": "team-a"},
        "status": {"conditions": conditions},
    }  # fmt: skip


def cache() -> tuple[WorkloadCache, Counter[tuple[str, str]]]:
    kube = SimpleNamespace(custom=SimpleNamespace(list_cluster_custom_object=lambda *_, **__: None))
    woken: Counter[tuple[str, str]] = Counter()
    return WorkloadCache(kube, lambda key: woken.update([key])), woken  # type: ignore[arg-type]


def event(kind: str, obj: dict[str, Any]) -> dict[str, Any]:
    return {"type": kind, "object": obj}


def test_a_workload_is_its_jobs_and_wakes_it_only_when_kueue_changed_something() -> None:
    workloads, woken = cache()
    informer = workloads.workload_informer
    informer.apply(event("ADDED", raw_workload("w1")))
    assert woken == {("ns", "llm"): 1}
    found = workloads.workload(("ns", "llm"), "uid-1")
    assert found is not None
    assert found.name == "w1"
    # Our own write moved the resourceVersion only: nothing decide reads changed.
    informer.apply(event("MODIFIED", raw_workload("w1", version="2")))
    assert woken == {("ns", "llm"): 1}
    assert workloads.workload(("ns", "llm"), "uid-1").resource_version == "2"  # type: ignore[union-attr]
    informer.apply(event("MODIFIED", raw_workload("w1", version="3", admitted=True)))
    assert woken == {("ns", "llm"): 2}
    informer.apply(event("DELETED", raw_workload("w1", version="4")))
    assert workloads.workload(("ns", "llm"), "uid-1") is None
    assert woken == {("ns", "llm"): 3}


def test_an_earlier_jobs_workload_is_not_the_current_ones() -> None:
    workloads, _ = cache()
    workloads.workload_informer.apply(event("ADDED", raw_workload("old", uid="uid-0")))
    assert workloads.workload(("ns", "llm"), "uid-1") is None
    workloads.workload_informer.apply(event("ADDED", raw_workload("new", uid="uid-1")))
    assert workloads.workload(("ns", "llm"), "uid-1").name == "new"  # type: ignore[union-attr]


def test_flavors_are_known_only_once_seen() -> None:
    workloads, _ = cache()
    assert workloads.flavors(["h100"]) is None
    flavor = {"metadata": {"name": "h100"}, "spec": {"nodeLabels": {"pool": "a"},
              "tolerations": [{"key": "k", "operator": "Exists"}]}}  # fmt: skip
    workloads.flavor_informer.apply(event("ADDED", flavor))
    [found] = workloads.flavors(["h100"]) or []
    assert (dict(found.node_labels), found.tolerations) == (
        {"pool": "a"},
        ({"key": "k", "operator": "Exists"},),
    )


def test_with_named_namespaces_workloads_are_listed_in_each_and_flavors_cluster_wide() -> None:
    listed: list[tuple[str, ...]] = []

    def namespaced(group: str, version: str, namespace: str, plural: str, **_: Any) -> None:
        listed.append((namespace, plural))

    def cluster_wide(group: str, version: str, plural: str, **_: Any) -> None:
        listed.append(("*", plural))

    kube = SimpleNamespace(
        custom=SimpleNamespace(
            list_cluster_custom_object=cluster_wide, list_namespaced_custom_object=namespaced
        )
    )
    workloads = WorkloadCache(kube, lambda key: None, namespaces=("team-a", "team-b"))  # type: ignore[arg-type]
    for informer in workloads.workload_informer.informers:  # type: ignore[union-attr]
        informer._lister(limit=1)
    workloads.flavor_informer._lister(limit=1)
    assert sorted(listed) == [
        ("*", contract.KUEUE_FLAVORS),
        ("team-a", contract.KUEUE_WORKLOADS),
        ("team-b", contract.KUEUE_WORKLOADS),
    ]
