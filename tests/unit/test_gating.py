"""The gang gate: pods behind it, the release patch, and what decide() makes of both."""

from __future__ import annotations

import json
from typing import Any

import pytest
from factories import NOW, ago, make_job, make_pod, make_pod_body

from trainwave import contract
from trainwave.api.status import ConditionType, Phase
from trainwave.builders.gating import build_release_patch, is_gated
from trainwave.builders.pods import build_worker_pods
from trainwave.lifecycle.decide import PlacementWait, decide
from trainwave.lifecycle.placing import INVALID_PLACEMENT
from trainwave.placement.ranks import Parallelism
from trainwave.placement.topology import DEFAULT_LEVELS
from trainwave.resolving import gang_request, resolve_job

pytestmark = pytest.mark.timeout(10)


def gated_gang(workers: int = 2, attempt: int = 0) -> list[Any]:
    return [
        make_pod(r, attempt, "Pending", ready=False, bound=False, gated=True)
        for r in range(workers)
    ]


def released(rank: int, *, bound: bool, at: float = 1, attempt: int = 0) -> Any:
    return make_pod(
        rank,
        attempt,
        "Running" if bound else "Pending",
        ready=bound,
        bound=bound,
        placed_node=f"gpu-{rank}",
        released_at=ago(at),
    )


# --- pods are born gated -------------------------------------------------------------------


def test_every_worker_pod_is_created_behind_the_gate() -> None:
    pods = build_worker_pods(
        resolve_job(make_job(workers=3, gpus_per_worker=8)), (0, 1, 2), attempt=0
    )
    assert all(is_gated(pod) for pod in pods)


def test_a_template_gate_of_someone_else_is_kept_beside_ours() -> None:
    template = {"spec": {"schedulingGates": [{"name": "example.com/quota"}]}}
    [pod] = build_worker_pods(resolve_job(make_job(workers=1, template=template)), (0,), attempt=0)
    assert [g["name"] for g in pod["spec"]["schedulingGates"]] == [
        "example.com/quota",
        contract.SCHEDULING_GATE,
    ]


# --- the release patch ---------------------------------------------------------------------


def pod_with(spec: dict[str, Any]) -> dict[str, Any]:
    body = make_pod_body(0, 0, "Pending", bound=False, gated=True)
    body["metadata"]["resourceVersion"] = "42"
    body["spec"].update(spec)
    return body


def test_release_pins_the_node_records_it_and_lifts_only_our_gate() -> None:
    pod = pod_with({"schedulingGates": [{"name": contract.SCHEDULING_GATE}, {"name": "other"}]})
    patch = build_release_patch(pod, "gpu-7", {contract.ANNOTATION_RELEASED_AT: "t"}, {"A": "1"})
    assert patch["metadata"]["resourceVersion"] == "42"
    assert patch["metadata"]["annotations"] == {
        contract.ANNOTATION_RELEASED_AT: "t",
        contract.ANNOTATION_PLACED_NODE: "gpu-7",
        contract.ANNOTATION_WORKER_ENV: json.dumps({"A": "1"}),
    }
    assert patch["spec"]["schedulingGates"] == [{"name": "other"}]
    terms = patch["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert terms == [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-7"]}]}
    ]


def test_release_of_the_last_gate_removes_the_list() -> None:
    patch = build_release_patch(pod_with({}), "gpu-0", {})
    assert patch["spec"]["schedulingGates"] is None  # merge patch: null deletes


def test_release_narrows_every_user_term_and_keeps_preferences() -> None:
    user_terms = [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]},
    ]
    preferred = [{"weight": 1, "preference": {"matchExpressions": []}}]
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": user_terms},
            "preferredDuringSchedulingIgnoredDuringExecution": preferred,
        }
    }
    pod = pod_with({"affinity": affinity})
    node_affinity = build_release_patch(pod, "gpu-3", {})["spec"]["affinity"]["nodeAffinity"]
    terms = node_affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert [t["matchExpressions"] for t in terms] == [t["matchExpressions"] for t in user_terms]
    assert all(t["matchFields"][-1]["values"] == ["gpu-3"] for t in terms)
    assert node_affinity["preferredDuringSchedulingIgnoredDuringExecution"] == preferred
    assert pod["spec"]["affinity"] == affinity, "the pod read must not be modified"


def test_release_without_a_node_lifts_the_gate_and_pins_nothing() -> None:
    patch = build_release_patch(pod_with({}), None, {})
    assert "affinity" not in patch["spec"]
    assert contract.ANNOTATION_PLACED_NODE not in patch["metadata"]["annotations"]


# --- the request -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("placement", "template", "expected"),
    [
        ({}, {}, {"preferred_level": "trainwave.io/rack", "required_level": None}),
        ({"requiredLevel": "rack"}, {}, {"preferred_level": None, "required_level": "rack"}),
        ({"preferredLevel": "spine"}, {}, {"preferred_level": "spine"}),
        ({"parallelism": {"tensor": 8, "pipeline": 2}}, {},
         {"parallelism": Parallelism(tensor=8, pipeline=2)}),
        ({}, {"spec": {"nodeSelector": {"pool": "a100"}}}, {"node_selector": {"pool": "a100"}}),
    ],
    ids=["default-prefers-rack", "required-level", "preferred-level", "parallelism", "selector"],
)  # fmt: skip
def test_gang_request_from_the_spec(
    placement: dict[str, Any], template: dict[str, Any], expected: dict[str, Any]
) -> None:
    job = make_job(workers=4, gpus_per_worker=8, placement=placement, template=template or None)
    request = gang_request(job, DEFAULT_LEVELS)
    assert (request.workers, request.gpus_per_worker) == (4, 8)
    for name, value in expected.items():
        assert getattr(request, name) == value, name


# --- decide() with the gate ------------------------------------------------------------------


def scheduled(decision: Any) -> tuple[str, str]:
    condition = decision.status.condition(ConditionType.SCHEDULED)
    assert condition is not None
    return condition.status, condition.reason


def test_a_gated_gang_asks_for_placement_and_says_so() -> None:
    decision = decide(resolve_job(make_job(phase="Pending", gpus_per_worker=8)), gated_gang(), NOW)
    assert decision.wants_placement
    assert decision.status.phase == Phase.SCHEDULING
    assert scheduled(decision) == ("False", "Placing")
    assert decision.create_ranks == ()


def test_a_waiting_gang_shows_the_engines_reason() -> None:
    why = PlacementWait("NotEnoughGPUs", "needs 32 GPUs within one rack; the largest free has 24")
    decision = decide(
        resolve_job(make_job(phase="Scheduling", gpus_per_worker=8)), gated_gang(), NOW, why
    )
    assert scheduled(decision) == ("False", "NotEnoughGPUs")
    assert decision.status.message == why.reason
    assert decision.status.reason == "NotEnoughGPUs"


def test_a_gang_not_all_created_is_not_handed_to_the_placer() -> None:
    decision = decide(resolve_job(make_job(phase="Pending")), gated_gang(1), NOW)
    assert not decision.wants_placement
    assert decision.create_ranks == (1,)


def test_an_invalid_placement_request_fails_the_job_and_stops_the_pods() -> None:
    why = PlacementWait(INVALID_PLACEMENT, "requiredLevel 'row' is not a level; levels: ...")
    decision = decide(resolve_job(make_job(phase="Scheduling")), gated_gang(), NOW, why)
    assert decision.status.phase == Phase.FAILED
    assert decision.status.reason == "InvalidSpec"
    assert "spec.placement" in decision.status.message
    assert len(decision.delete_pods) == 2
    assert not decision.wants_placement


def test_released_pods_record_the_placement_in_rank_order() -> None:
    pods = [released(1, bound=True), released(0, bound=True)]
    decision = decide(resolve_job(make_job(phase="Scheduling")), pods, NOW)
    assert decision.status.placement is not None
    assert decision.status.placement.nodes == ["gpu-0", "gpu-1"]
    assert decision.status.placement.summary == "placed by the test"
    assert not decision.wants_placement


def test_released_but_unbound_pods_wait_until_the_bind_timeout() -> None:
    pods = [released(0, bound=True, at=30), released(1, bound=False, at=30)]
    decision = decide(resolve_job(make_job(phase="Scheduling")), pods, NOW)
    assert decision.status.phase == Phase.SCHEDULING
    assert scheduled(decision) == ("False", "WaitingForNodes")
    assert decision.requeue_after == pytest.approx(120 - 30)
    assert decision.delete_pods == ()


def test_a_gang_that_did_not_bind_in_time_is_replanned_as_a_new_uncounted_attempt() -> None:
    job = make_job(phase="Scheduling", placement={"bindTimeoutSeconds": 30})
    pods = [released(0, bound=True, at=31), released(1, bound=False, at=31)]
    decision = decide(resolve_job(job), pods, NOW)
    assert decision.status.attempt == 1
    assert decision.status.restarts == 0
    assert scheduled(decision) == ("False", "BindTimeout")
    assert "worker(s) 1 not bound 30s after placement" in decision.status.message
    assert set(decision.delete_pods) == {p.name for p in pods}
    assert decision.status.placement is None
    assert [e.reason for e in decision.events] == ["BindTimeout"]
    assert decision.events[0].type == "Warning"
    assert decision.status.phase == Phase.PENDING, "in Scheduling, missing pods count as lost"


def test_the_new_attempt_after_a_bind_timeout_is_created_gated_again() -> None:
    job = make_job(phase="Pending", attempt=1)
    decision = decide(resolve_job(job), [], NOW)
    assert decision.create_ranks == (0, 1)
    pods = build_worker_pods(resolve_job(job), decision.create_ranks, decision.status.attempt)
    assert all(is_gated(pod) for pod in pods)
