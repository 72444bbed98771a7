"""One reconcile parses the job once and decides once, on the create path too.

The reconciler reads the body into one value (metadata, written status, spec) and
decides from it; the workers it creates are folded into that decision, not decided
again. Counted at the models' own parse entry point (`model_validate`), so a parse
hidden anywhere on the way (resolving, the status write, the error net) is seen.
"""

from __future__ import annotations

import asyncio
import sys
from collections import Counter
from types import SimpleNamespace
from typing import Any

import pytest
from factories import NOW, make_body, make_pod

from trainwave.api.spec import TrainingJobSpec
from trainwave.api.status import TrainingJobStatus
from trainwave.api.trainingjob import ObjectMeta
from trainwave.controller.reconciler import Reconciler
from trainwave.lifecycle import decide as decide_module
from trainwave.lifecycle.endpoints import addresses, published
from trainwave.lifecycle.observed import WorkerPod

pytestmark = pytest.mark.timeout(10)
KEY = ("team-a", "demo")
MODELS = {"metadata": ObjectMeta, "status": TrainingJobStatus, "spec": TrainingJobSpec}


class Api:
    """Stores the status it is sent and the pods it is asked to create."""

    def pod_events(self, _namespace: str, _uid: str) -> list[dict[str, Any]]:
        return []  # no worker sits long enough here to be looked up

    def __init__(self, body: dict[str, Any]):
        self.body = body
        self.status_patches = 0
        self.pods: list[dict[str, Any]] = []

    def patch_job_status(self, _ns: str, _name: str, _version: str, status: dict[str, Any]):
        self.status_patches += 1
        meta = {**self.body["metadata"], "resourceVersion": str(200 + self.status_patches)}
        self.body = {**self.body, "metadata": meta, "status": status}
        return self.body

    def create_pod(self, pod: dict[str, Any]) -> None:
        self.pods.append(pod)

    def apply_service(self, _service: dict[str, Any]) -> str:
        return "svc-uid"

    def apply_endpoint_slice(self, _endpoints: dict[str, Any]) -> None:
        pass

    def delete_pod(self, _namespace: str, _name: str) -> None:
        pass


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """How often each part of a job is parsed, by its model's `model_validate`."""
    counted: Counter[str] = Counter()
    for part, model in MODELS.items():
        original = model.model_validate

        def counting(cls: Any, obj: Any, *args: Any, _part: str = part, _original: Any = original,
                     **kwargs: Any) -> Any:  # fmt: skip
            counted[_part] += 1
            return _original(obj, *args, **kwargs)

        monkeypatch.setattr(model, "model_validate", classmethod(counting))
    return counted


@pytest.fixture
def decisions(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """One entry per call of the state machine, wherever the reconciler imported it from."""
    calls: list[int] = []
    original = decide_module.decide

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return original(*args, **kwargs)

    for module in list(sys.modules.values()):
        name = getattr(module, "__name__", "")
        if name.startswith("trainwave.") and getattr(module, "decide", None) is original:
            monkeypatch.setattr(module, "decide", counting)
    return calls


def reconcile(api: Api, pods: list[WorkerPod]) -> float | None:
    placer = SimpleNamespace(withdraw=lambda _k: None, submit=lambda _k, _t: None,
                             waiting=lambda _k: None)  # fmt: skip
    reconciler = Reconciler(
        api,  # type: ignore[arg-type]
        job_body=lambda _key: api.body,
        worker_pods=lambda _key: pods,
        service_states=lambda _key: frozenset({(0, addresses(published(pods, 0)))}),
        placer=placer,  # type: ignore[arg-type]
        levels=(),
        record_event=lambda _body, _event: None,
        clock=lambda: NOW,
    )
    return asyncio.run(reconciler(KEY))


def test_a_new_job_is_parsed_once_and_decided_once_though_its_workers_are_created(
    parses: Counter[str], decisions: list[int]
) -> None:
    api = Api(make_body(workers=2, gpus_per_worker=1))
    reconcile(api, [])

    assert len(api.pods) == 2, "the workers are created"
    assert api.status_patches == 1, "and one status counting them follows"
    assert api.body["status"]["phase"] == "Scheduling"
    assert dict(parses) == {"metadata": 1, "status": 1, "spec": 1}
    assert len(decisions) == 1


def test_a_running_job_is_parsed_once(parses: Counter[str], decisions: list[int]) -> None:
    body = make_body(workers=2, phase="Running", start_time=NOW)
    api = Api(body)
    pods = [make_pod(rank, pod_ip=f"10.0.0.{rank}") for rank in range(2)]
    reconcile(api, pods)

    assert api.body["status"]["phase"] == "Running"
    assert dict(parses) == {"metadata": 1, "status": 1, "spec": 1}
    assert len(decisions) == 1


def test_an_invalid_job_is_parsed_once(parses: Counter[str]) -> None:
    api = Api(make_body(workers=2, template={"spec": {"hostname": "mine"}}))
    reconcile(api, [])

    assert api.body["status"]["phase"] == "Failed"
    assert api.body["status"]["reason"] == "InvalidSpec"
    assert dict(parses) == {"metadata": 1, "status": 1, "spec": 1}
