"""When the reconciler lists a sitting worker's Events, and how often."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from factories import NOW, make_pod
from kubernetes.client.exceptions import ApiException

from trainwave.controller import pod_events
from trainwave.controller.pod_events import LOOKUP_AFTER, LOOKUP_EVERY, PodEvents
from trainwave.lifecycle.observed import WorkerPod

pytestmark = pytest.mark.timeout(10)

KEY = ("team", "demo")
MOUNT = {"type": "Warning", "reason": "FailedMount", "message": 'configmap "cfg" not found',
         "lastTimestamp": (NOW - timedelta(seconds=2)).isoformat().replace("+00:00", "Z")}  # fmt: skip


def sitting(rank: int) -> WorkerPod:
    return replace(make_pod(rank, phase="Pending", ready=False), uid=f"uid-{rank}")


class Api:
    def __init__(self, events: list[dict[str, Any]] | None = None):
        self.events = [MOUNT] if events is None else events
        self.asked: list[tuple[str, str]] = []
        self.error: Exception | None = None

    def __call__(self, namespace: str, uid: str) -> list[dict[str, Any]]:
        self.asked.append((namespace, uid))
        if self.error is not None:
            raise self.error
        return self.events


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def watcher(api: Api, clock: Clock) -> PodEvents:
    return PodEvents(api, clock=clock, wall=lambda: NOW)


def observe(warnings: PodEvents, pods: list[WorkerPod]) -> tuple[list[WorkerPod], float | None]:
    return asyncio.run(warnings.observe(KEY, pods, 0))


def test_a_worker_is_looked_up_once_it_has_sat_a_while_then_at_most_every_interval() -> None:
    api, clock = Api(), Clock()
    warnings = watcher(api, clock)
    pods, recheck = observe(warnings, [sitting(0)])
    assert api.asked == []
    assert pods[0].event_says == ""
    assert recheck == pytest.approx(LOOKUP_AFTER)
    clock.now += LOOKUP_AFTER
    pods, recheck = observe(warnings, [sitting(0)])
    assert api.asked == [("team", "uid-0")]
    assert pods[0].event_says == 'FailedMount: configmap "cfg" not found'
    assert recheck == pytest.approx(LOOKUP_EVERY)
    clock.now += LOOKUP_EVERY - 1
    pods, _ = observe(warnings, [sitting(0)])
    assert len(api.asked) == 1, "not again before the interval"
    assert pods[0].event_says, "what was read stays on the pod meanwhile"
    clock.now += 1
    observe(warnings, [sitting(0)])
    assert len(api.asked) == 2


def test_a_worker_that_starts_is_forgotten_and_nothing_is_asked_back() -> None:
    api, clock = Api(), Clock()
    warnings = watcher(api, clock)
    observe(warnings, [sitting(0)])
    clock.now += LOOKUP_AFTER
    observe(warnings, [sitting(0)])
    started = replace(sitting(0), phase=make_pod(0).phase, ready=True)
    pods, recheck = observe(warnings, [started])
    assert recheck is None
    assert pods[0].event_says == ""
    clock.now += LOOKUP_AFTER
    pods, recheck = observe(warnings, [sitting(0)])  # sits again: counted afresh
    assert (len(api.asked), recheck) == (1, pytest.approx(LOOKUP_AFTER))


def test_lookups_go_lowest_rank_first_a_few_per_reconcile() -> None:
    api, clock = Api(events=[]), Clock()
    warnings = watcher(api, clock)
    gang = [sitting(rank) for rank in (3, 1, 0, 2)]
    observe(warnings, gang)
    clock.now += LOOKUP_AFTER
    observe(warnings, gang)
    assert [uid for _, uid in api.asked] == ["uid-0", "uid-1"]


def test_across_jobs_the_lookups_keep_to_a_rate_and_the_deferred_are_asked_back_soon() -> None:
    """Many gangs sitting at once (a slow start on many nodes) must not become a burst of
    LISTs: the rate holds across jobs, and a job deferred is reconciled again soon."""
    api, clock = Api(events=[]), Clock()
    warnings = watcher(api, clock)
    jobs = {("team", f"job-{n}"): [replace(sitting(0), uid=f"uid-{n}")] for n in range(20)}

    def reconcile_all() -> dict[tuple[str, str], float | None]:
        return {key: asyncio.run(warnings.observe(key, pods, 0))[1] for key, pods in jobs.items()}

    reconcile_all()
    clock.now += LOOKUP_AFTER
    rechecks = reconcile_all()
    asked = len(api.asked)
    assert 1 <= asked <= pod_events.LOOKUPS_PER_SECOND + 1
    deferred = [key for key, recheck in rechecks.items() if recheck == pod_events.DEFERRED_SECONDS]
    assert len(deferred) == len(jobs) - asked
    clock.now += pod_events.DEFERRED_SECONDS
    reconcile_all()
    assert asked < len(api.asked) <= asked + pod_events.LOOKUPS_PER_SECOND + 1


def test_a_failed_lookup_leaves_the_job_as_it_was_and_is_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=pod_events.__name__)
    api, clock = Api(), Clock()
    api.error = ApiException(status=403, reason="Forbidden")
    warnings = watcher(api, clock)
    observe(warnings, [sitting(0)])
    for _ in range(3):
        clock.now += LOOKUP_EVERY
        pods, recheck = observe(warnings, [sitting(0)])
        assert pods[0].event_says == ""
        assert recheck is not None
    assert len(api.asked) == 3
    said = [r for r in caplog.records if "could not list the events" in r.getMessage()]
    assert len(said) == 1
    assert "Forbidden" in said[0].getMessage()


def test_forget_drops_what_was_kept_of_a_job() -> None:
    api, clock = Api(), Clock()
    warnings = watcher(api, clock)
    observe(warnings, [sitting(0)])
    warnings.forget(KEY)
    clock.now += LOOKUP_AFTER
    observe(warnings, [sitting(0)])
    assert api.asked == [], "first seen again now: not due yet"
