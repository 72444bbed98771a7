"""The reconciler's net for errors nobody planned for: a condition and an Event on the job,
the error handed on to the work queue's backoff, and transient API trouble left to it alone.

The API client here is a stand-in that stores the status it is sent: what is tested is
the reconciler's own handling, not the API server (the integration tests do that).
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
from factories import NOW, make_body, make_pod, pod_name
from kubernetes.client.exceptions import ApiException

from trainwave.controller.api_errors import Refused
from trainwave.controller.departures import Departures
from trainwave.controller.reconciler import Reconciler
from trainwave.lifecycle.decide import JobEvent
from trainwave.lifecycle.endpoints import ServiceState, addresses, published
from trainwave.lifecycle.observed import WorkerPod

pytestmark = pytest.mark.timeout(10)
KEY = ("team-a", "demo")


class StatusStore:
    """Takes status merge patches into one job body; `fail` makes the next patch raise."""

    def pod_events(self, _namespace: str, _uid: str) -> list[dict[str, Any]]:
        return []  # no worker sits long enough here to be looked up

    def __init__(self, body: dict[str, Any]):
        self.body = body
        self.patches = 0
        self.fail: Exception | None = None

    def patch_job_status(self, _ns: str, _name: str, version: str, status: dict[str, Any]):
        if self.fail is not None:
            raise self.fail
        assert version == self.body["metadata"]["resourceVersion"]
        self.patches += 1
        self.body = {**self.body, "status": status}
        self.body["metadata"] = {
            **self.body["metadata"],
            "resourceVersion": str(100 + self.patches),
        }
        return self.body

    def create_pod(self, _pod: dict[str, Any]) -> None:
        pass

    def apply_service(self, _service: dict[str, Any]) -> str:
        return "svc-uid"

    def apply_endpoint_slice(self, _endpoints: dict[str, Any]) -> None:
        pass

    def delete_pod(self, _namespace: str, _name: str) -> None:
        pass


def named(pods: list[WorkerPod], attempt: int = 0) -> frozenset[ServiceState]:
    """The EndpointSlice a watch shows once the operator named `pods`' attempt."""
    return frozenset({(attempt, addresses(published(pods, attempt)))})


def reconciler(
    store: StatusStore, pods: Any, service_states: Any = None
) -> tuple[Reconciler, list[JobEvent]]:
    """`service_states`: what the watch shows of the job's EndpointSlice; by default it
    names the attempt-0 workers `pods` returns."""
    if service_states is None:
        service_states = lambda key: named(pods(key))  # noqa: E731
    events: list[JobEvent] = []
    placer = SimpleNamespace(withdraw=lambda _k: None, submit=lambda _k, _t: None,
                             waiting=lambda _k: None)  # fmt: skip
    made = Reconciler(
        store,  # type: ignore[arg-type]
        job_body=lambda _key: store.body,
        worker_pods=pods,
        service_states=service_states,
        placer=placer,  # type: ignore[arg-type]
        levels=(),
        record_event=lambda _body, event: events.append(event),
        clock=lambda: NOW,
    )
    return made, events


def condition(body: dict[str, Any]) -> dict[str, Any] | None:
    found = [c for c in body["status"].get("conditions", []) if c["type"] == "ReconcileError"]
    return found[0] if found else None


def test_an_unexpected_error_is_written_on_the_job_and_retried_with_backoff() -> None:
    store = StatusStore(make_body())
    broken = True

    def pods(_key: Any) -> list[Any]:
        if broken:
            raise KeyError("containers")
        return []

    reconcile, events = reconciler(store, pods)
    for _ in range(2):  # the second failure says nothing new: no second Event
        with pytest.raises(KeyError):  # handed on: the work queue backs off and logs it
            asyncio.run(reconcile(KEY))
    found = condition(store.body)
    assert found is not None
    assert found["status"] == "True"
    assert found["reason"] == "ReconcileError"
    assert found["message"] == "reconcile failed, retrying with backoff: KeyError: 'containers'"
    assert store.body["status"]["reason"] == "ReconcileError"
    assert [(e.type, e.reason) for e in events] == [("Warning", "ReconcileError")]

    broken = False
    asyncio.run(reconcile(KEY))
    cleared = condition(store.body)
    assert cleared is not None
    assert (cleared["status"], cleared["reason"]) == ("False", "Reconciled")
    assert store.body["status"]["phase"] == "Scheduling"  # its workers were just created
    assert events[-1].reason == "Reconciled"


@pytest.mark.parametrize(
    "error",
    [
        pytest.param(ApiException(status=503, reason="Service Unavailable"), id="503"),
        pytest.param(ApiException(status=500, reason="etcdserver: leader changed"), id="500"),
        pytest.param(ApiException(status=429, reason="Too Many Requests"), id="429"),
        pytest.param(ApiException(status=409, reason="Conflict"), id="409"),
        pytest.param(TimeoutError("read timed out"), id="timeout"),
        pytest.param(ConnectionRefusedError("refused"), id="refused"),
    ],
)
def test_transient_api_errors_are_only_retried_never_written_as_the_jobs_fault(error) -> None:
    store = StatusStore(make_body())

    def pods(_key: Any) -> list[Any]:
        raise error

    reconcile, events = reconciler(store, pods)
    with pytest.raises(type(error)):
        asyncio.run(reconcile(KEY))
    assert store.patches == 0
    assert events == []


def test_when_the_error_cannot_be_written_either_the_original_is_handed_on() -> None:
    store = StatusStore(make_body())
    store.fail = ApiException(status=403, reason="Forbidden")

    def pods(_key: Any) -> list[Any]:
        raise ValueError("a bug")

    reconcile, _ = reconciler(store, pods)
    with pytest.raises(ValueError, match="a bug"):
        asyncio.run(reconcile(KEY))


class CountingStore(StatusStore):
    def __init__(self, body: dict[str, Any]):
        super().__init__(body)
        self.applied: list[str] = []

    def create_pod(self, pod: dict[str, Any]) -> None:
        self.applied.append(pod["metadata"]["name"])


def test_pods_created_but_not_yet_watched_hold_the_next_decision_back() -> None:
    # The watch shows our own status write before the pods' ADDED events: deciding
    # then would apply the pods again and write "0/2 workers created" once more.
    store = CountingStore(make_body(workers=2))
    watched: list[Any] = []
    reconcile, _ = reconciler(store, lambda _key: list(watched))
    assert asyncio.run(reconcile(KEY)) is None
    assert sorted(store.applied) == [pod_name(0), pod_name(1)]
    patches = store.patches

    waited = asyncio.run(reconcile(KEY))
    assert waited is not None
    assert 0 < waited <= 15, "held back, and woken again when the hold expires"
    assert len(store.applied) == 2, "no second apply of pods already created"
    assert store.patches == patches, "no status write from a view that lacks them"

    watched.append(make_pod(0, phase="Pending", bound=False, gated=True))
    assert asyncio.run(reconcile(KEY)) is not None, "one of the two is still unseen"
    watched.append(make_pod(1, phase="Pending", bound=False, gated=True))
    asyncio.run(reconcile(KEY))
    assert len(store.applied) == 2
    assert store.body["status"]["phase"] == "Scheduling", "decided once both are seen"


def test_a_departure_the_job_cache_records_reaches_the_reconciler() -> None:
    # The operator hands the reconciler the Departures its job cache records into. An
    # empty one is falsy (it has a length): the reconciler once replaced it with a
    # private one, so an evicted worker whose pod was gone was judged "vanished".
    store = StatusStore(make_body(workers=2, phase="Running", max_restarts=0))
    departures = Departures()
    placer = SimpleNamespace(withdraw=lambda _k: None, submit=lambda _k, _t: None,
                             waiting=lambda _k: None)  # fmt: skip
    reconcile = Reconciler(
        store,  # type: ignore[arg-type]
        job_body=lambda _key: store.body,
        worker_pods=lambda _key: [make_pod(0)],
        service_states=lambda _key: named([make_pod(0)]),
        placer=placer,  # type: ignore[arg-type]
        levels=(),
        record_event=lambda _body, _event: None,
        departures=departures,
        clock=lambda: NOW,
    )
    evicted = ({"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"},)
    gone = make_pod(1, conditions=evicted, deleting=True)
    departures.record(KEY, gone)
    asyncio.run(reconcile(KEY))
    status = store.body["status"]
    assert (status["restarts"], status["disruptions"]) == (0, 1)


class QuotaOnServices(StatusStore):
    """Refuses the Service as a ResourceQuota would, until `refuse` is turned off."""

    def __init__(self, body: dict[str, Any]):
        super().__init__(body)
        self.refuse = True
        self.services = 0

    def apply_service(self, _service: dict[str, Any]) -> str:
        if self.refuse:
            raise Refused("service team-a/demo", "exceeded quota: q, limited: services=0")
        self.services += 1
        return "svc-uid"


def replica_failure(body: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in body["status"]["conditions"] if c["type"] == "ReplicaFailure")


def test_a_refused_service_stays_on_the_job_and_is_retried_until_it_is_created() -> None:
    store = QuotaOnServices(make_body(phase="Starting", start_time=NOW))
    pods = [make_pod(rank, pod_ip=f"10.0.0.{rank + 1}") for rank in (0, 1)]
    reconcile, events = reconciler(
        store, lambda _key: pods, lambda _key: named(pods) if store.services else frozenset()
    )
    for _ in range(3):
        assert (asyncio.run(reconcile(KEY)) or 0) > 0  # a retry with backoff
        failure = replica_failure(store.body)
        assert failure["status"] == "True", failure
        assert failure["message"].startswith("creating service team-a/demo failed: exceeded quota")
    assert store.body["status"]["phase"] == "Running"  # the workers run; the name is missing
    assert [e.reason for e in events].count("FailedCreate") == 1  # said once, not per retry

    store.refuse = False
    asyncio.run(reconcile(KEY))
    assert store.services == 1
    asyncio.run(reconcile(KEY))  # the Service is observed now: the condition clears
    assert replica_failure(store.body)["status"] == "False"


def test_a_service_the_watch_has_not_shown_yet_is_not_applied_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = QuotaOnServices(make_body(phase="Starting", start_time=NOW))
    store.refuse = False
    pods = [make_pod(rank, pod_ip=f"10.0.0.{rank + 1}") for rank in (0, 1)]
    reconcile, _events = reconciler(store, lambda _key: pods, lambda _key: frozenset())  # lags
    now = [1000.0]
    monkeypatch.setattr("trainwave.controller.reconciler.time.monotonic", lambda: now[0])
    for _ in range(3):
        asyncio.run(reconcile(KEY))
    assert store.services == 1
    now[0] += 16.0  # past the expectation: still not in the watch, so applied again
    asyncio.run(reconcile(KEY))
    assert store.services == 2


class RefusingPods(StatusStore):
    """Counts the pods applied; refuses them as a ResourceQuota would while `refuse`."""

    def __init__(self, body: dict[str, Any]):
        super().__init__(body)
        self.refuse = False
        self.pods: list[str] = []

    def create_pod(self, pod: dict[str, Any]) -> None:
        if self.refuse:
            raise Refused(f"pod {pod['metadata']['name']}", "exceeded quota: q, limited: pods=0")
        self.pods.append(pod["metadata"]["name"])


def test_a_new_job_gets_its_workers_and_then_one_status_that_counts_them() -> None:
    store = RefusingPods(make_body())
    reconcile, events = reconciler(store, lambda _key: [])
    asyncio.run(reconcile(KEY))
    assert sorted(store.pods) == [pod_name(0), pod_name(1)]
    assert store.patches == 1  # no "0/2 workers created" first
    status = store.body["status"]
    assert (status["phase"], status["reason"]) == ("Scheduling", "Placing")
    assert status["startTime"] == status["attemptStartTime"]  # set by the creating decision
    assert [e.reason for e in events] == ["Created", "Placing"]


def test_workers_refused_leave_the_job_pending_with_the_reason_in_one_write() -> None:
    store = RefusingPods(make_body())
    store.refuse = True
    reconcile, events = reconciler(store, lambda _key: [])
    assert (asyncio.run(reconcile(KEY)) or 0) > 0  # retried with backoff
    assert store.patches == 1
    status = store.body["status"]
    assert (status["phase"], status["reason"]) == ("Pending", "FailedCreate")
    assert [e.reason for e in events] == ["Created", "FailedCreate"]
