"""Where the placer puts a replacement worker (runPolicy.workerReplacement): a gang partly
released (its other workers run) gets its gated worker placed in the gang's own rack when
one has room, through one-ticket rounds of the same `_decide`; otherwise by the queue's
round and its objective. Against a watch cache filled by hand."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest
from factories import make_job

from trainwave import contract
from trainwave.builders.pods import build_worker_pods
from trainwave.controller.clusterview import ClusterIndex
from trainwave.controller.placement_inputs import Ticket
from trainwave.controller.placer import Placer
from trainwave.placement.records import node_record, pod_record
from trainwave.resolving import resolve_job

pytestmark = pytest.mark.timeout(10)

LEVELS = ("rack", "kubernetes.io/hostname")


class FakeKube:
    def __init__(self) -> None:
        self.patched: dict[str, dict[str, Any]] = {}

    def patch_pod(self, _namespace: str, name: str, patch: dict[str, Any]) -> None:
        self.patched[name] = patch


def node(name: str, rack: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"rack": rack, "kubernetes.io/hostname": name}},
        "status": {
            "allocatable": {contract.GPU_RESOURCE: "8", "cpu": "64", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def pinned_node(patch: dict[str, Any]) -> str:
    [term] = patch["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    [value] = term["matchFields"][0]["values"]
    return str(value)


def replace_worker_1(
    nodes: list[dict[str, Any]], running_on: str, terminating_on: str | None = None
) -> str:
    """Worker 0 of a 2 x 8 GPU gang runs on `running_on`; worker 1 waits behind the gate
    (its replacement), its old pod still terminating on `terminating_on` if given. The
    node the placer pins worker 1 to."""
    index = ClusterIndex()
    for body in nodes:
        index.put_node(body["metadata"]["name"], node_record(body))
    resolved = resolve_job(make_job("job", workers=2, gpus_per_worker=8), LEVELS)
    worker0, worker1 = build_worker_pods(resolved, (0, 1), 0)
    pods = [worker0, worker1]
    if terminating_on is not None:
        old = copy.deepcopy(worker1)
        del old["spec"]["schedulingGates"]
        old["spec"]["nodeName"] = terminating_on
        old["metadata"]["deletionTimestamp"] = "2026-11-28T12:00:00Z"
        old["status"] = {"phase": "Running"}
        worker1["metadata"]["name"] += "-r1"  # as builders/names.py names a replacement
        worker1["metadata"]["labels"][contract.LABEL_REPLACEMENT] = "1"
        pods.append(old)
    del worker0["spec"]["schedulingGates"]
    worker0["spec"]["nodeName"] = running_on
    worker0["status"] = {"phase": "Running"}
    for pod in pods:
        meta = pod["metadata"]
        meta["uid"] = f"uid-{meta['name']}"
        index.put_pod(f"{meta['namespace']}/{meta['name']}", pod_record(pod))
    kube = FakeKube()
    placer = Placer(kube, LEVELS, lambda key: None, index.view)  # type: ignore[arg-type]
    namespace = worker1["metadata"]["namespace"]
    placer.submit((namespace, "job"), Ticket(attempt=0, request=resolved.gang))

    async def go() -> None:
        await placer.round()
        await placer.drain()

    asyncio.run(go())
    return pinned_node(kube.patched[worker1["metadata"]["name"]])


def test_the_replacement_goes_to_the_gangs_rack_although_best_fit_would_not() -> None:
    # r0: a (worker 0), b, c free; r1: d free alone. Best fit takes d (the fullest rack
    # that fits); the gang's rack has room, so the replacement goes there.
    nodes = [node("a", "r0"), node("b", "r0"), node("c", "r0"), node("d", "r1")]
    assert replace_worker_1(nodes, running_on="a") in {"b", "c"}


def test_without_the_gangs_rack_first_best_fit_would_take_the_other_rack(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What the test above rests on: the queue's round alone puts the worker on d."""

    async def nowhere(*_args: Any) -> list[Any]:
        return []

    monkeypatch.setattr(Placer, "_place_near", nowhere)
    nodes = [node("a", "r0"), node("b", "r0"), node("c", "r0"), node("d", "r1")]
    assert replace_worker_1(nodes, running_on="a") == "d"


def test_the_old_pod_still_terminating_holds_its_node_and_does_not_count_in_the_gang() -> None:
    # The old worker 1 terminates on b and holds its GPUs there, as kube-scheduler counts
    # a terminating pod; the gang is still whole (worker 0 and the gated replacement).
    nodes = [node("a", "r0"), node("b", "r0"), node("c", "r0"), node("d", "r1")]
    assert replace_worker_1(nodes, running_on="a", terminating_on="b") == "c"


def test_with_no_room_in_the_gangs_rack_the_objective_places_it() -> None:
    nodes = [node("a", "r0"), node("d", "r1")]
    assert replace_worker_1(nodes, running_on="a") == "d"


def test_a_whole_gated_gang_is_placed_by_the_queue_as_before() -> None:
    # Both workers gated: nothing runs, no domain to keep; the round places the gang whole.
    index = ClusterIndex()
    for body in (node("a", "r0"), node("b", "r0"), node("d", "r1")):
        index.put_node(body["metadata"]["name"], node_record(body))
    resolved = resolve_job(make_job("job", workers=2, gpus_per_worker=8), LEVELS)
    pods = build_worker_pods(resolved, (0, 1), 0)
    for pod in pods:
        meta = pod["metadata"]
        meta["uid"] = f"uid-{meta['name']}"
        index.put_pod(f"{meta['namespace']}/{meta['name']}", pod_record(pod))
    kube = FakeKube()
    placer = Placer(kube, LEVELS, lambda key: None, index.view)  # type: ignore[arg-type]
    placer.submit((pods[0]["metadata"]["namespace"], "job"), Ticket(0, resolved.gang))

    async def go() -> None:
        await placer.round()
        await placer.drain()

    asyncio.run(go())
    assert {pinned_node(kube.patched[p["metadata"]["name"]]) for p in pods} == {"a", "b"}
