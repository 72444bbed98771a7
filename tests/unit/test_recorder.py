"""The background Event recorder: order kept, time taken when recorded, overload drops
Events (never decisions), and one failing post does not stop the next."""

from __future__ import annotations

import asyncio
import logging
import threading
from datetime import datetime
from typing import Any

import pytest

from trainwave.kube.recorder import EventRecorder, Rate
from trainwave.lifecycle.decide import JobEvent

pytestmark = pytest.mark.timeout(10)

JOB = {"metadata": {"name": "j", "namespace": "ns", "uid": "u"}}


def test_events_are_posted_in_order_with_the_time_they_were_recorded() -> None:
    posted: list[tuple[str, datetime]] = []
    gate = threading.Event()

    def post(job: dict[str, Any], event: JobEvent, when: datetime) -> None:
        gate.wait(5)  # a slow API server: the reconcile must not wait for it
        if event.reason == "Bad":
            raise RuntimeError("500")
        posted.append((event.reason, when))

    async def run() -> datetime:
        recorder = EventRecorder(post)
        recorder.start()
        for reason in ("Created", "Bad", "Placing", "Running"):
            recorder.record(JOB, JobEvent("Normal", reason, "m"))
        recorded = datetime.now().astimezone()
        await asyncio.sleep(0.05)
        assert posted == [], "recording returned before anything was posted"
        gate.set()
        await asyncio.wait_for(recorder.drain(), 5)
        await recorder.stop()
        return recorded

    recorded = asyncio.run(run())
    assert [reason for reason, _ in posted] == ["Created", "Placing", "Running"]
    assert all(when <= recorded for _, when in posted), "stamped when recorded, not posted"


def test_a_full_queue_drops_and_counts() -> None:
    async def run() -> EventRecorder:
        recorder = EventRecorder(lambda *_: None, max_queued=2)
        for reason in ("a", "b", "c"):
            recorder.record(JOB, JobEvent("Normal", reason, "m"))
        return recorder

    assert asyncio.run(run()).dropped == 1


@pytest.mark.parametrize(
    ("namespaces", "namespace", "posted"),
    [
        pytest.param((), "anywhere", True, id="cluster-wide-posts-everywhere"),
        pytest.param(("team-a",), "team-a", True, id="watched-name"),
        pytest.param(("team-*",), "team-b", True, id="watched-pattern"),
        pytest.param(("team-a",), "team-b", False, id="other-namespace-dropped"),
        pytest.param(("team-a",), "", False, id="cluster-scoped-dropped"),
    ],
)
def test_with_watched_namespaces_events_elsewhere_are_dropped_with_a_log_line(
    namespaces: tuple[str, ...], namespace: str, posted: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """The chart grants Events only through Roles in the watched namespaces: one about an
    object elsewhere (a Node's would go to `default`) is dropped here, not refused there."""
    seen: list[str] = []

    async def run() -> EventRecorder:
        recorder = EventRecorder(lambda job, *_: seen.append(job["metadata"]["name"]),
                                 namespaces=namespaces)  # fmt: skip
        recorder.start()
        recorder.record({"metadata": {"name": "j", "namespace": namespace}},
                        JobEvent("Warning", "NodeLost", "m"))  # fmt: skip
        await asyncio.wait_for(recorder.drain(), 5)
        await recorder.stop()
        return recorder

    recorder = asyncio.run(run())
    assert seen == (["j"] if posted else [])
    assert recorder.outside == (0 if posted else 1)
    if not posted:
        assert "not posting Event NodeLost about j" in caplog.text
        assert "outside the watched namespaces team-a" in caplog.text


def test_a_rate_limited_reason_passes_its_burst_then_one_per_period(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Kueue's reason may flap as other jobs come and go: a few Events at once, then one
    per period, per job; other reasons and other jobs are not held back."""
    caplog.set_level(logging.INFO, logger="trainwave.kube.recorder")
    now = [0.0]
    rates = {"KueuePending": Rate(burst=2, every=60.0)}

    async def run() -> tuple[EventRecorder, list[tuple[str, str]]]:
        seen: list[tuple[str, str]] = []
        recorder = EventRecorder(lambda job, event, _: seen.append((job["metadata"]["name"],
                                 event.reason)), rates=rates, clock=lambda: now[0])  # fmt: skip
        recorder.start()
        other = {"metadata": {"name": "other", "namespace": "ns"}}
        for _ in range(4):
            recorder.record(JOB, JobEvent("Normal", "KueuePending", "m"))
        recorder.record(other, JobEvent("Normal", "KueuePending", "m"))
        recorder.record(JOB, JobEvent("Normal", "Queued", "m"))
        now[0] = 59.0
        recorder.record(JOB, JobEvent("Normal", "KueuePending", "m"))  # not a full token yet
        now[0] = 61.0
        recorder.record(JOB, JobEvent("Normal", "KueuePending", "m"))
        await asyncio.wait_for(recorder.drain(), 5)
        await recorder.stop()
        return recorder, seen

    recorder, seen = asyncio.run(run())
    assert seen == [("j", "KueuePending"), ("j", "KueuePending"), ("other", "KueuePending"),
                    ("j", "Queued"), ("j", "KueuePending")]  # fmt: skip
    assert recorder.limited == 3
    assert "Event KueuePending about ns/j held back" in caplog.text
