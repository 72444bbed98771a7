"""When the operator lists a sitting worker's Events, how often, and when it wakes the job."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from factories import NOW, make_pod
from kubernetes.client.exceptions import ApiException

from trainwave.api.trainingjob import JobKey
from trainwave.controller import pod_events
from trainwave.controller.pod_events import LOOKUP_AFTER, LOOKUP_EVERY, PodEvents
from trainwave.lifecycle.observed import WorkerPod

pytestmark = pytest.mark.timeout(10)

KEY = ("team", "demo")
MOUNT = {"type": "Warning", "reason": "FailedMount", "message": 'configmap "cfg" not found',
         "lastTimestamp": (NOW - timedelta(seconds=2)).isoformat().replace("+00:00", "Z")}  # fmt: skip


def sitting(rank: int, uid: str = "") -> WorkerPod:
    return replace(make_pod(rank, phase="Pending", ready=False), uid=uid or f"uid-{rank}")


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


class Lookups:
    """A PodEvents over `Api`, with a clock the test moves and the jobs it woke."""

    def __init__(self, api: Api) -> None:
        self.api, self.clock = api, Clock()
        self.woken: list[JobKey] = []
        self.events = PodEvents(api, self.woken.append, clock=self.clock, wall=lambda: NOW)

    def after(self, seconds: float) -> None:
        """`seconds` pass, then the loop looks once."""
        self.clock.now += seconds
        asyncio.run(self.events.look_up_due())


def test_a_worker_is_looked_up_once_it_has_sat_a_while_then_at_most_every_interval() -> None:
    lookups = Lookups(Api())
    pods = lookups.events.observe(KEY, [sitting(0)], 0)
    assert pods[0].event_says == ""
    lookups.after(LOOKUP_AFTER - 1)
    assert lookups.api.asked == []
    lookups.after(1)
    assert lookups.api.asked == [("team", "uid-0")]
    assert lookups.woken == [KEY], "what it says changed: the job is reconciled"
    pods = lookups.events.observe(KEY, [sitting(0)], 0)
    assert pods[0].event_says == 'FailedMount: configmap "cfg" not found'
    lookups.after(LOOKUP_EVERY - 1)
    assert len(lookups.api.asked) == 1, "not again before the interval"
    lookups.after(1)
    assert len(lookups.api.asked) == 2
    assert lookups.woken == [KEY], "the same words again: no reconcile for nothing"


def test_a_worker_that_starts_is_dropped_and_never_looked_up() -> None:
    """A gang starting normally costs no lookup and no extra reconcile."""
    lookups = Lookups(Api())
    lookups.events.observe(KEY, [sitting(0)], 0)
    started = replace(sitting(0), phase=make_pod(0).phase, ready=True)
    assert lookups.events.observe(KEY, [started], 0)[0].event_says == ""
    lookups.after(LOOKUP_AFTER)
    assert (lookups.api.asked, lookups.woken) == ([], [])
    lookups.events.observe(KEY, [sitting(0)], 0)  # sits again: counted afresh
    lookups.after(LOOKUP_AFTER - 1)
    assert lookups.api.asked == []


def test_lookups_go_lowest_rank_first_a_few_per_job() -> None:
    lookups = Lookups(Api(events=[]))
    lookups.events.observe(KEY, [sitting(rank) for rank in (3, 1, 0, 2)], 0)
    lookups.after(LOOKUP_AFTER)
    assert [uid for _, uid in lookups.api.asked] == ["uid-0", "uid-1"]
    assert lookups.woken == [], "nothing to say, nothing changed"


def test_across_jobs_the_lookups_keep_to_a_rate() -> None:
    """Many gangs sitting at once (a slow start on many nodes) must not become a burst of
    LISTs: each look takes at most the rate's share, the rest come in the next ones."""
    lookups = Lookups(Api(events=[]))
    for n in range(20):
        lookups.events.observe(("team", f"job-{n}"), [sitting(0, uid=f"uid-{n}")], 0)
    lookups.after(LOOKUP_AFTER)
    assert len(lookups.api.asked) == pod_events.LOOKUPS_PER_SECOND
    lookups.after(pod_events.TICK_SECONDS)
    assert len(lookups.api.asked) == 2 * pod_events.LOOKUPS_PER_SECOND
    lookups.after(pod_events.TICK_SECONDS)
    lookups.after(pod_events.TICK_SECONDS)
    assert sorted(uid for _, uid in lookups.api.asked) == sorted(f"uid-{n}" for n in range(20))


def test_a_failed_lookup_leaves_the_job_as_it_was_and_is_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=pod_events.__name__)
    lookups = Lookups(Api())
    lookups.api.error = ApiException(status=403, reason="Forbidden")
    lookups.events.observe(KEY, [sitting(0)], 0)
    lookups.after(LOOKUP_AFTER)
    for _ in range(2):
        lookups.after(LOOKUP_EVERY)
    assert len(lookups.api.asked) == 3
    assert lookups.woken == []
    assert lookups.events.observe(KEY, [sitting(0)], 0)[0].event_says == ""
    said = [r for r in caplog.records if "could not list the events" in r.getMessage()]
    assert len(said) == 1
    assert "Forbidden" in said[0].getMessage()


def test_forget_drops_what_was_kept_of_a_job() -> None:
    lookups = Lookups(Api())
    lookups.events.observe(KEY, [sitting(0)], 0)
    lookups.events.forget(KEY)
    lookups.after(LOOKUP_AFTER)
    assert lookups.api.asked == []
