"""A worker sitting Pending on its node, and which of the kubelet's warnings names why."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from factories import NOW, make_pod

from trainwave.lifecycle.observed import PodPhase, WorkerPod
from trainwave.lifecycle.sitting import WARNING_MAX_AGE, latest_warning, sits_pending

pytestmark = pytest.mark.timeout(10)


def stamp(seconds_ago: float) -> str:
    return (NOW - timedelta(seconds=seconds_ago)).isoformat().replace("+00:00", "Z")


def event(reason: str, message: str, seconds_ago: float, kind: str = "Warning") -> dict[str, Any]:
    return {"type": kind, "reason": reason, "message": message, "lastTimestamp": stamp(seconds_ago)}


SITTING = replace(make_pod(0, phase="Pending", ready=False), uid="pod-uid-0")


@pytest.mark.parametrize(
    ("pod", "attempt", "sits"),
    [
        (SITTING, 0, True),
        (SITTING, 1, False),  # an older attempt's
        (replace(SITTING, bound=False), 0, False),  # kube-scheduler's to place
        (replace(SITTING, bound=False, gated=True), 0, False),  # the placer's
        (replace(SITTING, phase=PodPhase.RUNNING, ready=True), 0, False),
        (replace(SITTING, deleting=True), 0, False),
        (replace(SITTING, stuck="container worker waiting: ErrImagePull"), 0, False),
        (replace(SITTING, departed=True), 0, False),
        (replace(SITTING, uid=""), 0, False),  # nothing to list its Events by
    ],
    ids=[
        "sitting",
        "old-attempt",
        "unbound",
        "gated",
        "running",
        "deleting",
        "stuck",
        "departed",
        "no-uid",
    ],
)
def test_only_a_released_bound_pending_worker_with_no_container_to_blame_sits(
    pod: WorkerPod, attempt: int, sits: bool
) -> None:
    assert sits_pending(pod, attempt) is sits


def test_the_newest_recent_warning_is_named_with_its_reason() -> None:
    events = [
        event(
            "FailedMount", 'MountVolume.SetUp failed for volume "cfg" : configmap "a" not found', 40
        ),
        event(
            "FailedMount",
            'MountVolume.SetUp failed for volume "cfg" :\n configmap "b" not found',
            5,
        ),
        event("Scheduled", "Successfully assigned", 1, kind="Normal"),
    ]
    assert latest_warning(events, NOW) == (
        'FailedMount: MountVolume.SetUp failed for volume "cfg" : configmap "b" not found'
    )


def test_a_warning_older_than_the_kubelets_retries_says_nothing_of_now() -> None:
    old = WARNING_MAX_AGE.total_seconds() + 1
    assert latest_warning([event("FailedCreatePodSandBox", "cni failed", old)], NOW) == ""
    assert latest_warning([], NOW) == ""


def test_an_events_time_is_its_series_then_last_timestamp_then_event_time() -> None:
    series = {**event("FailedMount", "new", 900), "series": {"lastObservedTime": stamp(2)}}
    micro = {"type": "Warning", "reason": "NetworkNotReady", "message": "cni",
             "eventTime": (NOW - timedelta(seconds=3)).isoformat()}  # fmt: skip
    undated = {"type": "Warning", "reason": "Undated", "message": "x"}
    assert latest_warning([micro, series, undated], NOW) == "FailedMount: new"
    assert latest_warning([micro, undated], NOW) == "NetworkNotReady: cni"


def test_a_long_message_is_cut_and_an_empty_one_leaves_the_reason() -> None:
    said = latest_warning([event("FailedMount", "x" * 1000, 1)], NOW)
    assert said == "FailedMount: " + "x" * 200
    assert latest_warning([event("FailedMount", "", 1)], NOW) == "FailedMount"
