"""When the reconciler asks the placer to place a new gang before its pods exist, and when it
does not: the pods it creates, the room it gives back, the status it holds and then writes.

The API client and the placer are stand-ins that record what they are asked; the placer's
own decision is tested in test_place_at_creation.py, the real path in
integration/test_gang_placement.py.
"""

from __future__ import annotations

import asyncio
import copy
from datetime import timedelta
from typing import Any

import pytest
from factories import NOW, make_body

from trainwave import contract
from trainwave.builders.gating import build_release_patch, is_gated, merged
from trainwave.controller.api_errors import Refused
from trainwave.controller.placement_inputs import with_admission_defaults
from trainwave.controller.reconciler import HOLD_SECONDS, Reconciler
from trainwave.lifecycle.decide import JobEvent
from trainwave.lifecycle.observed import WorkerPod, observe_pod

pytestmark = pytest.mark.timeout(10)
KEY = ("team-a", "demo")


class Api:
    """Stores the status it is sent and the pods it is asked to create; `refuse` names a
    pod whose create the API server refuses."""

    def pod_events(self, _namespace: str, _uid: str) -> list[dict[str, Any]]:
        return []  # no worker sits long enough here to be looked up

    def __init__(self, body: dict[str, Any]):
        self.body = body
        self.status_patches = 0
        self.pods: list[dict[str, Any]] = []
        self.services = 0
        self.slices: list[dict[str, Any]] = []
        self.refuse = ""
        self.dry_runs: list[str] = []
        self.admission: Any = None  # a webhook's change to a dry-run pod; an exception: refused

    def patch_job_status(self, _ns: str, _name: str, _version: str, status: dict[str, Any]):
        self.status_patches += 1
        meta = {**self.body["metadata"], "resourceVersion": str(200 + self.status_patches)}
        self.body = {**self.body, "metadata": meta, "status": status}
        return self.body

    def create_pod(self, pod: dict[str, Any]) -> None:
        if pod["metadata"]["name"] == self.refuse:
            raise Refused(f"pod {pod['metadata']['name']}", "exceeded quota")
        self.pods.append(pod)

    def dry_run_pod(self, pod: dict[str, Any]) -> dict[str, Any]:
        self.dry_runs.append(pod["metadata"]["name"])
        if isinstance(self.admission, Exception):
            raise self.admission
        stored = with_admission_defaults(copy.deepcopy(pod))
        if self.admission is not None:
            self.admission(stored)
        return stored

    def apply_service(self, _service: dict[str, Any]) -> str:
        self.services += 1
        return f"svc-uid-{self.services}"

    def apply_endpoint_slice(self, endpoints: dict[str, Any]) -> None:
        self.slices.append(endpoints)

    def delete_pod(self, _namespace: str, _name: str) -> None:
        pass


class Placer:
    """Places every gang it is asked about on `node`, or none when `room` is False."""

    def __init__(self, room: bool = True):
        self.room = room
        self.asked: list[int] = []
        self.forgotten: list[str] = []
        self.tickets: list[Any] = []

    async def place_now(self, _key: Any, _ticket: Any, pods: list[dict[str, Any]]) -> Any:
        self.asked.append(len(pods))
        if not self.room:
            return None
        notes = {contract.ANNOTATION_RELEASED_AT: "2026-11-26T08:00:00Z"}
        return [merged(p, build_release_patch(p, "node-a", notes)) for p in pods]

    def forget_unborn(self, _namespace: str, name: str) -> None:
        self.forgotten.append(name)

    def submit(self, _key: Any, ticket: Any) -> None:
        self.tickets.append(ticket)

    def withdraw(self, _key: Any) -> None:
        pass

    def waiting(self, _key: Any) -> None:
        return None


class Guards:
    def __init__(self, blocker: str = "", webhooks: tuple[str, ...] = ()):
        self.blocker_text = blocker
        self.webhooks = list(webhooks)

    def blocker(self, _namespace: str) -> str:
        return self.blocker_text

    def pod_webhooks(self) -> list[str]:
        return self.webhooks


class Operator:
    """One reconciler over `api`, seeing the pods `api` created as `seen` makes them."""

    def __init__(self, api: Api, placer: Placer, guards: Guards | None):
        self.api = api
        self.events: list[JobEvent] = []
        self.seen = lambda pod: pod  # what the watch shows of a created pod
        self.now = NOW
        self.reconciler = Reconciler(
            api,  # type: ignore[arg-type]
            job_body=lambda _key: api.body,
            worker_pods=lambda _key: self.pods(),
            service_states=lambda _key: frozenset(),
            placer=placer,  # type: ignore[arg-type]
            levels=(),
            record_event=lambda _body, event: self.events.append(event),
            guards=guards,  # type: ignore[arg-type]
            clock=lambda: self.now,
        )

    def pods(self) -> list[WorkerPod]:
        seen = (observe_pod(self.seen(copy.deepcopy(pod))) for pod in self.api.pods)
        return [pod for pod in seen if pod is not None]

    def reconcile(self) -> float | None:
        return asyncio.run(self.reconciler(KEY))


def running(pod: dict[str, Any]) -> dict[str, Any]:
    pod["spec"]["nodeName"] = "node-a"
    pod["status"] = {"phase": "Running", "podIP": "10.0.0.1"}
    return pod


def created_then_restarted(api: Api) -> None:
    """One operator creates a placed gang; another, started after it, sees it running."""
    placer = Placer()
    Operator(api, placer, Guards()).reconcile()
    successor = Operator(api, placer, Guards())
    successor.seen = running
    successor.now = NOW + timedelta(seconds=2)
    successor.reconcile()


def reconcile(api: Api, placer: Placer, guards: Guards | None) -> None:
    Operator(api, placer, guards).reconcile()


def test_a_new_gang_with_room_is_created_placed_and_its_status_held() -> None:
    api, placer = Api(make_body(workers=2, gpus_per_worker=1)), Placer()
    requeue = Operator(api, placer, Guards()).reconcile()

    assert placer.asked == [2]
    assert len(api.pods) == 2
    assert not any(is_gated(pod) for pod in api.pods)
    assert placer.tickets == [], "nothing is queued for a gang that is placed"
    assert api.status_patches == 0, "held: the pods' events come within the batch period"
    assert requeue == HOLD_SECONDS, "written by then at the latest"


def test_the_next_reconcile_writes_one_status_from_the_held_one() -> None:
    api, placer = Api(make_body(workers=2, gpus_per_worker=1)), Placer()
    operator = Operator(api, placer, Guards())
    operator.reconcile()
    operator.seen = running
    operator.now = NOW + timedelta(seconds=1)
    operator.reconcile()

    assert api.status_patches == 1
    status = api.body["status"]
    assert status["phase"] == "Running"
    assert status["startTime"] == "2026-01-01T12:00:00Z", "when the workers were created"
    assert status["placement"]["nodes"] == ["node-a", "node-a"]
    assert [c["type"] for c in status["conditions"]][:1] == ["Created"]
    reasons = [event.reason for event in operator.events]
    assert reasons == ["AllWorkersRunning"], "no news of phases no status showed"


def test_the_service_comes_with_the_pods_and_the_publishing_reconcile_writes_one_slice() -> None:
    """At 2,000 jobs a second write in a row on the reconcile that found the gang addressed
    held the reconcile workers a third longer: the Service is applied with the pods."""
    api, placer = Api(make_body(workers=2, gpus_per_worker=1)), Placer()
    operator = Operator(api, placer, Guards())
    operator.reconcile()
    assert (api.services, api.slices) == (1, []), "no names before the workers have addresses"
    operator.seen = running
    operator.now = NOW + timedelta(seconds=1)
    operator.reconcile()

    assert api.services == 1, "not applied again"
    (endpoints,) = api.slices
    assert endpoints["metadata"]["ownerReferences"][0]["uid"] == "svc-uid-1"


def test_a_publish_without_a_service_applied_with_the_pods_applies_it_first() -> None:
    """An operator restarted between the two (or a Service deleted since) applies it again,
    and the slice takes the UID it answers with."""
    api = Api(make_body(workers=2, gpus_per_worker=1))
    created_then_restarted(api)

    assert api.services == 2
    (endpoints,) = api.slices
    assert endpoints["metadata"]["ownerReferences"][0]["uid"] == "svc-uid-2"


def test_a_warning_about_the_spec_outlives_the_held_phase() -> None:
    """Phase news held with a status no write ever showed is dropped; a warning about the
    spec (a GPU limit trainwave replaced) is news whatever phase is written next."""
    template = {"spec": {"containers": [
        {"name": "worker", "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}}  # fmt: skip
    api = Api(make_body(workers=2, gpus_per_worker=1, template=template))
    operator = Operator(api, Placer(), Guards())
    operator.reconcile()
    operator.seen = running
    operator.now = NOW + timedelta(seconds=1)
    operator.reconcile()

    assert api.body["status"]["phase"] == "Running"
    reasons = [event.reason for event in operator.events]
    assert reasons == ["ResourcesOverridden", "AllWorkersRunning"]
    operator.reconcile()
    assert [e.reason for e in operator.events].count("ResourcesOverridden") == 1


def test_a_held_status_that_is_still_true_is_written_with_its_news() -> None:
    api, placer = Api(make_body(workers=2, gpus_per_worker=1)), Placer()
    operator = Operator(api, placer, Guards())
    operator.reconcile()
    operator.reconcile()  # the pods are not bound yet: still Scheduling

    assert api.status_patches == 1
    assert api.body["status"]["phase"] == "Scheduling"
    assert [e.reason for e in operator.events] == ["Created", "WaitingForNodes"]


def test_a_held_status_is_written_as_it_was_when_the_watch_is_late_with_the_pods() -> None:
    api, placer = Api(make_body(workers=2, gpus_per_worker=1)), Placer()
    operator = Operator(api, placer, Guards())
    operator.reconcile()
    operator.seen = lambda pod: {}  # not a worker: as if the watch had not shown it yet
    requeue = operator.reconcile()

    assert api.status_patches == 1, "held 1 s at most, whatever the watch says"
    assert api.body["status"]["phase"] == "Scheduling"
    assert api.body["status"]["placement"]["nodes"] == ["node-a", "node-a"]
    assert [e.reason for e in operator.events] == ["Created", "WaitingForNodes"]
    assert requeue is not None, "the pods are still waited for"
    assert requeue > 0


def test_a_held_status_gives_way_to_one_written_meanwhile() -> None:
    api, placer = Api(make_body(workers=2, gpus_per_worker=1)), Placer()
    operator = Operator(api, placer, Guards())
    operator.reconcile()
    api.body = {**api.body, "status": {"phase": "Pending", "message": "written elsewhere"}}
    operator.seen = running
    operator.now = NOW + timedelta(seconds=3)
    operator.reconcile()

    assert api.body["status"]["phase"] == "Running"
    assert api.body["status"]["startTime"] == "2026-01-01T12:00:03Z", "not the held one's"


def test_a_lost_status_is_rebuilt_from_the_workers() -> None:
    """An operator restarted while it held the status: the new one decides from the pods."""
    api = Api(make_body(workers=2, gpus_per_worker=1))
    created_then_restarted(api)

    assert len(api.pods) == 2, "no worker created twice"
    status = api.body["status"]
    assert status["phase"] == "Running"
    assert status["startTime"] == "2026-01-01T12:00:02Z"
    assert status["attemptStartTime"] == "2026-01-01T12:00:02Z"


def test_a_gang_without_room_is_created_gated_and_queued() -> None:
    api, placer = Api(make_body(workers=2, gpus_per_worker=1)), Placer(room=False)
    reconcile(api, placer, Guards())

    assert placer.asked == [2]
    assert all(is_gated(pod) for pod in api.pods)
    assert len(placer.tickets) == 1
    assert api.status_patches == 1, "a gated gang's status is written at once"


@pytest.mark.parametrize(
    ("guards", "template"),
    [
        pytest.param(None, None, id="no-guards"),
        pytest.param(Guards("a LimitRange in namespace team-a"), None, id="limit-range"),
        pytest.param(Guards(), {"spec": {"runtimeClassName": "kata"}}, id="runtime-class"),
    ],
)
def test_where_a_pod_may_change_on_its_way_in_the_placer_is_not_asked(
    guards: Guards | None, template: dict[str, Any] | None
) -> None:
    api, placer = Api(make_body(workers=2, gpus_per_worker=1, template=template)), Placer()
    reconcile(api, placer, guards)

    assert placer.asked == []
    assert len(api.pods) == 2
    assert all(is_gated(pod) for pod in api.pods)


def test_a_shared_gpu_gang_is_not_placed_at_creation() -> None:
    body = make_body(workers=1, gpuSharing={"memory": "20Gi"})
    api, placer = Api(body), Placer()
    reconcile(api, placer, Guards())

    assert placer.asked == []
    assert len(api.pods) == 1
    assert is_gated(api.pods[0])


def test_a_refused_create_gives_the_placed_room_back() -> None:
    api, placer = Api(make_body(workers=2, gpus_per_worker=1)), Placer()
    api.refuse = "demo-a0-worker-1"
    reconcile(api, placer, Guards())

    assert placer.forgotten == ["demo-a0-worker-1"], "only the pod that was not created"
    assert api.body["status"]["conditions"][-1]["reason"] == "FailedCreate"


def _adds_a_toleration(stored: dict[str, Any]) -> None:
    stored["spec"]["tolerations"].append({"key": "spot", "operator": "Exists"})


def _labels(stored: dict[str, Any]) -> None:
    stored["metadata"]["labels"]["audited"] = "yes"


@pytest.mark.parametrize(
    ("admission", "placed"),
    [
        pytest.param(None, True, id="unchanged"),
        pytest.param(_labels, True, id="labels-only"),
        pytest.param(_adds_a_toleration, False, id="toleration-added"),
        pytest.param(Refused("pod demo-a0-worker-0", "denied"), False, id="dry-run-refused"),
    ],
)
def test_with_a_pod_webhook_a_dry_run_of_the_first_placed_pod_decides(
    admission: Any, placed: bool
) -> None:
    api, placer = Api(make_body(workers=2, gpus_per_worker=1)), Placer()
    api.admission = admission
    reconcile(api, placer, Guards(webhooks=("kueue-mutating-webhook-configuration",)))

    assert api.dry_runs == ["demo-a0-worker-0"], "one dry run per gang"
    assert len(api.pods) == 2
    assert all(not is_gated(pod) for pod in api.pods) is placed
    assert all(is_gated(pod) for pod in api.pods) is not placed
    assert placer.forgotten == ([] if placed else ["demo-a0-worker-0", "demo-a0-worker-1"])


def test_without_a_pod_webhook_there_is_no_dry_run() -> None:
    api, placer = Api(make_body(workers=2, gpus_per_worker=1)), Placer()
    reconcile(api, placer, Guards())

    assert api.dry_runs == []
    assert all(not is_gated(pod) for pod in api.pods)
