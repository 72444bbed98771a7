"""A worker sitting Pending on its node, and which of its Events says why."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from factories import NOW, make_pod

from trainwave.lifecycle.observed import PodPhase, WorkerPod
from trainwave.lifecycle.sitting import EVENT_MAX_AGE, explaining_event, sits_pending

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


def test_the_newest_event_is_named_when_it_is_a_warning() -> None:
    events = [
        event(
            "FailedMount", 'MountVolume.SetUp failed for volume "cfg" : configmap "a" not found', 40
        ),
        event("Scheduled", "Successfully assigned", 60, kind="Normal"),
        event(
            "FailedMount",
            'MountVolume.SetUp failed for volume "cfg" :\n configmap "b" not found',
            5,
        ),
    ]
    assert explaining_event(events, NOW) == (
        'FailedMount: MountVolume.SetUp failed for volume "cfg" : configmap "b" not found'
    )


def test_an_image_being_pulled_explains_the_wait_other_progress_does_not() -> None:
    pulling = event("Pulling", 'Pulling image "big:1"', 3, kind="Normal")
    assert explaining_event([event("FailedMount", "x", 30), pulling], NOW) == (
        'Pulling: Pulling image "big:1"'
    ), "the mount passed at last, and the image is being pulled"
    pulled = event("Pulled", "Successfully pulled", 1, kind="Normal")
    assert explaining_event([event("FailedMount", "x", 30), pulled], NOW) == ""


def test_events_of_one_second_are_ordered_by_their_writes() -> None:
    warning = {**event("FailedMount", "x", 1), "metadata": {"resourceVersion": "900"}}
    pulling = {**event("Pulling", "y", 1, kind="Normal"), "metadata": {"resourceVersion": "901"}}
    assert explaining_event([pulling, warning], NOW) == "Pulling: y"
    assert (
        explaining_event([{**pulling, "metadata": {"resourceVersion": "899"}}, warning], NOW)
        == "FailedMount: x"
    )


def test_of_a_failed_pulls_two_events_the_one_that_says_why_is_named() -> None:
    """The kubelet's two `Failed` Events of one pull, as the real node wrote them when a
    registry refused a pull without credentials: the later one says only ErrImagePull."""
    why = ('Failed to pull image "reg:5000/w:1": failed to resolve image: '
           "authorization failed: no basic auth credentials")  # fmt: skip
    detailed = {**event("Failed", why, 2), "metadata": {"resourceVersion": "500"}}
    generic = {**event("Failed", "Error: ErrImagePull", 2), "metadata": {"resourceVersion": "501"}}
    assert explaining_event([detailed, generic], NOW) == f"Failed: {why}"
    older = {**detailed, "lastTimestamp": stamp(30)}
    assert explaining_event([older, generic], NOW) == "Failed: Error: ErrImagePull", (
        "an earlier second's message does not stand in for the newest"
    )
    pulling = {**event("Pulling", 'Pulling image "reg:5000/w:1" now', 2, kind="Normal"),
               "metadata": {"resourceVersion": "499"}}  # fmt: skip
    assert explaining_event([pulling, generic], NOW) == "Failed: Error: ErrImagePull", (
        "only Events of the newest's reason are its twins"
    )


def test_a_schedulers_event_of_the_same_second_is_not_newer_for_its_microseconds() -> None:
    """kube-scheduler writes events.k8s.io Events (eventTime, microseconds), the kubelet core
    ones (lastTimestamp, whole seconds): found on the real node, where `Scheduled` at
    12.4 s hid the kubelet's `Pulling` written after it at "12 s"."""
    second = NOW.replace(microsecond=0) - timedelta(seconds=3)
    scheduled = {"type": "Normal", "reason": "Scheduled", "message": "assigned",
                 "eventTime": (second + timedelta(microseconds=456789)).isoformat(),
                 "metadata": {"resourceVersion": "700"}}  # fmt: skip
    pulling = {"type": "Normal", "reason": "Pulling", "message": 'Pulling image "x:1"',
               "lastTimestamp": second.isoformat().replace("+00:00", "Z"),
               "metadata": {"resourceVersion": "701"}}  # fmt: skip
    assert explaining_event([scheduled, pulling], NOW) == 'Pulling: Pulling image "x:1"'


def test_an_event_older_than_the_kubelets_retries_says_nothing_of_now() -> None:
    old = EVENT_MAX_AGE.total_seconds() + 1
    assert explaining_event([event("FailedCreatePodSandBox", "cni failed", old)], NOW) == ""
    assert explaining_event([], NOW) == ""


def test_an_events_time_is_its_series_then_last_timestamp_then_event_time() -> None:
    series = {**event("FailedMount", "new", 900), "series": {"lastObservedTime": stamp(2)}}
    micro = {"type": "Warning", "reason": "NetworkNotReady", "message": "cni",
             "eventTime": (NOW - timedelta(seconds=3)).isoformat()}  # fmt: skip
    undated = {"type": "Warning", "reason": "Undated", "message": "x"}
    assert explaining_event([micro, series, undated], NOW) == "FailedMount: new"
    assert explaining_event([micro, undated], NOW) == "NetworkNotReady: cni"


def test_a_long_message_is_cut_and_an_empty_one_leaves_the_reason() -> None:
    said = explaining_event([event("FailedMount", "x" * 1000, 1)], NOW)
    assert said == "FailedMount: " + "x" * 200
    assert explaining_event([event("FailedMount", "", 1)], NOW) == "FailedMount"
