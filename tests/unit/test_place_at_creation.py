"""A gang placed before its pods exist (placer.place_now), against a watch cache filled by
hand: the same round as the queue's, the room held until the cache shows the pods, and
the pods created as their release would leave them."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest
from factories import make_job

from trainwave import contract
from trainwave.builders.gating import build_release_patch, merged
from trainwave.builders.pods import build_worker_pods
from trainwave.controller.admission_guards import mutates_pods
from trainwave.controller.clusterview import ClusterIndex
from trainwave.controller.inflight import Inflight
from trainwave.controller.placement_inputs import (
    Ticket,
    changed_on_the_way_in,
    with_admission_defaults,
)
from trainwave.controller.placer import Placer
from trainwave.placement.gang_types import GangRequest
from trainwave.placement.records import node_record, pod_record
from trainwave.resolving import resolve_job

pytestmark = pytest.mark.timeout(10)

LEVELS = ("rack",)


def node(name: str, rack: str, gpus: int = 8) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"rack": rack, "kubernetes.io/hostname": name}},
        "status": {
            "allocatable": {contract.GPU_RESOURCE: str(gpus), "cpu": "64", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def cluster(*nodes: dict[str, Any]) -> ClusterIndex:
    index = ClusterIndex()
    for body in nodes:
        index.put_node(body["metadata"]["name"], node_record(body))
    return index


def gang(name: str, workers: int = 2, gpus: int = 4) -> tuple[Ticket, list[dict[str, Any]]]:
    resolved = resolve_job(make_job(name, workers=workers, gpus_per_worker=gpus), LEVELS)
    ticket = Ticket(attempt=0, request=resolved.gang)
    return ticket, build_worker_pods(resolved, tuple(range(workers)), 0)


def place(placer: Placer, name: str, ticket: Ticket, pods: list[dict[str, Any]]) -> Any:
    return asyncio.run(placer.place_now(("ns", name), ticket, pods))


def test_a_gang_that_fits_is_created_pinned_annotated_and_ungated() -> None:
    index = cluster(node("a", "r0"), node("b", "r1"))
    placer = Placer(None, LEVELS, lambda key: None, index.view)  # type: ignore[arg-type]
    ticket, pods = gang("first")

    placed = place(placer, "first", ticket, pods)

    assert placed is not None
    assert len(placed) == 2
    nodes = {p["metadata"]["annotations"][contract.ANNOTATION_PLACED_NODE] for p in placed}
    assert len(nodes) == 1, "4+4 GPUs fit on one node: the round keeps the gang together"
    for pod in placed:
        assert "schedulingGates" not in pod["spec"]
        assert "resourceVersion" not in pod["metadata"]
        [term] = pod["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]["nodeSelectorTerms"]
        assert term["matchFields"] == [
            {"key": "metadata.name", "operator": "In", "values": sorted(nodes)}
        ]
        assert contract.ANNOTATION_RELEASED_AT in pod["metadata"]["annotations"]


def test_the_room_is_held_until_the_cache_shows_the_pods() -> None:
    index = cluster(node("a", "r0"))  # 8 GPUs: one gang of 2 x 4
    placer = Placer(None, LEVELS, lambda key: None, index.view)  # type: ignore[arg-type]
    first, first_pods = gang("first")
    second, second_pods = gang("second")

    placed = place(placer, "first", first, first_pods)
    assert placed is not None
    assert place(placer, "second", second, second_pods) is None, "the first gang holds node a"

    for pod in placed:  # the watch shows them now: counted there, not twice
        meta = pod["metadata"]
        index.put_pod(f"{meta['namespace']}/{meta['name']}", pod_record(pod))
    assert place(placer, "second", second, second_pods) is None


def test_a_refused_create_gives_its_room_back() -> None:
    index = cluster(node("a", "r0"))
    placer = Placer(None, LEVELS, lambda key: None, index.view)  # type: ignore[arg-type]
    first, first_pods = gang("first")
    second, second_pods = gang("second")
    placed = place(placer, "first", first, first_pods)
    assert placed is not None

    for pod in placed:
        placer.forget_unborn(pod["metadata"]["namespace"], pod["metadata"]["name"])

    assert place(placer, "second", second, second_pods) is not None


def test_a_gang_one_of_whose_names_is_held_is_created_behind_the_gate() -> None:
    """An old worker of the same name (a job deleted and applied again) refuses that one
    create: placed at creation, the gang's other pods would run without it."""
    index = cluster(node("a", "r0"), node("b", "r1"))
    held = {"ns/first-a0-worker-1"}
    placer = Placer(None, LEVELS, lambda key: None, index.view,  # type: ignore[arg-type]
                    present=lambda namespace, name: f"{namespace}/{name}" in held)  # fmt: skip
    ticket, pods = gang("first")

    assert place(placer, "first", ticket, pods) is None

    held.clear()
    assert place(placer, "first", ticket, pods) is not None, "placed once the name is free"


def test_it_never_jumps_the_queue_or_places_what_does_not_fit() -> None:
    index = cluster(node("a", "r0"))
    placer = Placer(None, LEVELS, lambda key: None, index.view)  # type: ignore[arg-type]
    ticket, pods = gang("big", workers=2, gpus=8)
    assert place(placer, "big", ticket, pods) is None, "16 GPUs on an 8-GPU cluster"

    placer.submit(("ns", "waiting"), ticket)
    small, small_pods = gang("small", workers=1, gpus=1)
    assert place(placer, "small", small, small_pods) is None, "a gang waits ahead of it"


def test_an_unborn_reservation_lapses_when_its_pod_never_appears() -> None:
    now = [0.0]
    inflight = Inflight(clock=lambda: now[0])
    index = cluster(node("a", "r0"))
    _, pods = gang("first", workers=1, gpus=8)
    record = pod_record(pods[0])
    assert record is not None
    inflight.add_unborn(record, "a")

    inflight.settle(index.view())
    assert inflight.apply(index.view().snapshot(LEVELS)).node("a").free == 0

    now[0] = 60.0
    inflight.settle(index.view())
    assert len(inflight) == 0


def test_merged_is_a_json_merge_patch() -> None:
    target = {"a": {"b": 1, "c": [1, 2]}, "d": 1}
    patch = {"a": {"b": None, "c": [3]}, "e": {"f": None, "g": 2}}
    assert merged(target, patch) == {"a": {"c": [3]}, "d": 1, "e": {"g": 2}}
    assert target == {"a": {"b": 1, "c": [1, 2]}, "d": 1}, "the input is left alone"


def test_a_pod_built_pinned_equals_the_released_pod() -> None:
    _, [pod] = gang("first", workers=1, gpus=1)
    patch = build_release_patch(pod, "node-7", {"k": "v"})
    created = merged(pod, patch)
    assert "schedulingGates" not in created["spec"]
    assert created["metadata"]["annotations"]["k"] == "v"
    assert created["spec"]["containers"] == pod["spec"]["containers"]


@pytest.mark.parametrize(
    ("tolerations", "added"),
    [
        ([], 2),
        ([{"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"}], 1),
        ([{"operator": "Exists"}], 0),  # tolerates every taint
        ([{"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"}], 2),
    ],
)
def test_admission_defaults_add_the_two_no_execute_tolerations(
    tolerations: list[dict[str, Any]], added: int
) -> None:
    pod = {"metadata": {}, "spec": {"tolerations": tolerations}}
    stored = with_admission_defaults(pod)
    assert len(stored["spec"]["tolerations"]) == len(tolerations) + added
    assert pod["spec"]["tolerations"] == tolerations


def as_stored(pod: dict[str, Any], change: Any = None) -> dict[str, Any]:
    """`pod` as the API server answers its dry-run create: the admission plugins' two
    tolerations and some of the API's defaults, then what `change` (a webhook) does."""
    stored = copy.deepcopy(with_admission_defaults(pod))
    stored["spec"].setdefault("dnsPolicy", "ClusterFirst")
    stored["spec"]["priority"] = 0
    stored["metadata"]["uid"] = "dry-run"
    for container in stored["spec"]["containers"]:
        container.setdefault("terminationMessagePath", "/dev/termination-log")
    if change is not None:
        change(stored)
    return stored


def _toleration(stored: dict[str, Any]) -> None:
    stored["spec"]["tolerations"].append({"key": "spot", "operator": "Exists"})


def _request(stored: dict[str, Any]) -> None:
    stored["spec"]["containers"][0]["resources"].setdefault("requests", {})["cpu"] = "250m"


def _selector(stored: dict[str, Any]) -> None:
    stored["spec"]["nodeSelector"] = {"pool": "batch"}


def _gate(stored: dict[str, Any]) -> None:
    stored["spec"]["schedulingGates"] = [{"name": "kueue.x-k8s.io/admission"}]


def _label(stored: dict[str, Any]) -> None:
    stored["metadata"]["labels"]["team"] = "a"
    stored["metadata"].setdefault("annotations", {})["audited"] = "yes"
    stored["spec"]["containers"][0].setdefault("env", []).append({"name": "X", "value": "1"})


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (None, ""),
        (_label, ""),  # placement reads none of these
        (_toleration, "tolerations"),
        (_request, "requests"),
        (_selector, "node selector"),
        (_gate, "scheduling gates kueue.x-k8s.io/admission"),
    ],
)
def test_a_dry_run_names_what_admission_changed_that_placement_relied_on(
    change: Any, named: str
) -> None:
    _, [pod] = gang("first", workers=1, gpus=1)
    placed = merged(pod, build_release_patch(pod, "node-7", {"k": "v"}))
    assert changed_on_the_way_in(placed, as_stored(placed, change)) == named


def webhook(**rule: list[str]) -> dict[str, Any]:
    base = {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": []}
    return {"metadata": {"name": "hook"}, "webhooks": [{"rules": [{**base, **rule}]}]}


@pytest.mark.parametrize(
    ("rule", "blocks"),
    [
        ({"resources": ["pods"]}, True),
        ({"resources": ["*"]}, True),
        ({"resources": ["*/*"], "apiGroups": ["*"], "operations": ["*"]}, True),
        ({"resources": ["pods"], "operations": ["UPDATE"]}, False),
        ({"resources": ["pods/status"]}, False),
        ({"resources": ["deployments"], "apiGroups": ["apps"]}, False),
        ({"resources": ["services"]}, False),
    ],
)
def test_only_a_webhook_that_may_mutate_a_pod_create_blocks(
    rule: dict[str, list[str]], blocks: bool
) -> None:
    assert (mutates_pods(webhook(**rule)) == "hook") is blocks


def test_a_gang_request_is_what_the_ticket_carries() -> None:
    ticket, _ = gang("first")
    assert isinstance(ticket.request, GangRequest)
