"""The reconciler's expectations (controller/bookkeeping.py): pods created for an attempt
and Services applied count as there until the watch shows them, at most
EXPECTATIONS_SECONDS."""

from __future__ import annotations

import dataclasses

import pytest

from trainwave.controller.bookkeeping import EXPECTATIONS_SECONDS, Bookkeeping
from trainwave.lifecycle.observed import WorkerPod

pytestmark = pytest.mark.timeout(10)

KEY = ("ns", "job")
POD = WorkerPod(
    name="job-w0-a1",
    owner_uid="uid",
    rank=0,
    attempt=1,
    phase="Pending",
    ready=False,
    bound=False,
    deleting=False,
    exit_code=None,
    reason="",
    finished_at=None,
)


class Clock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


def test_pods_wait_until_seen_in_the_attempt_they_were_created_for() -> None:
    clock = Clock()
    books = Bookkeeping(clock)
    books.expect_pods(KEY, 1, frozenset({"job-w0-a1"}))
    clock.now += 4
    stale = dataclasses.replace(POD, attempt=0)
    assert books.unseen(KEY, [stale]) == pytest.approx(EXPECTATIONS_SECONDS - 4), (
        "a pod of the same name from another attempt is not the one created"
    )
    assert books.unseen(KEY, [POD]) is None
    books.expect_pods(KEY, 2, frozenset({"job-w0-a2"}))
    assert books.unseen(KEY, []) is not None
    books.forget(KEY)
    assert books.unseen(KEY, []) is None, "a forgotten job waits for nothing"


def test_pods_never_seen_stop_holding_the_job_after_the_expiry() -> None:
    clock = Clock()
    books = Bookkeeping(clock)
    books.expect_pods(KEY, 1, frozenset({"job-w0-a1"}))
    clock.now += EXPECTATIONS_SECONDS
    assert books.unseen(KEY, []) is None
    clock.now -= 1
    assert books.unseen(KEY, []) is None, "a lapsed expectation is forgotten"


def test_an_applied_slice_counts_as_there_until_watched_or_expired() -> None:
    clock = Clock()
    books = Bookkeeping(clock)
    named = frozenset({("job-a0-worker-0", "10.0.0.1")})
    assert not books.service_exists(KEY, (0, named), watched=False)
    books.applied_service(KEY, (0, named))
    assert books.service_exists(KEY, (0, named), watched=False)
    clock.now += EXPECTATIONS_SECONDS - 1
    assert books.service_exists(KEY, (0, named), watched=False)
    assert books.service_exists(KEY, (0, named), watched=True)
    assert not books.service_exists(KEY, (0, named), watched=False), (
        "once watched, a slice gone from the watch is applied again"
    )
    books.applied_service(KEY, (0, named))
    clock.now += EXPECTATIONS_SECONDS
    assert not books.service_exists(KEY, (0, named), watched=False)
    books.applied_service(KEY, (1, named))
    assert not books.service_exists(KEY, (2, named), watched=False), "applied for another attempt"
    assert not books.service_exists(KEY, (1, frozenset()), watched=False), "other addresses"
    assert books.service_exists(KEY, (1, named), watched=False)


def test_the_service_applied_with_the_pods_is_named_once() -> None:
    books = Bookkeeping(Clock())
    assert books.service_uid(KEY) is None
    books.applied_service_with_pods(KEY, "uid-1")
    assert books.service_uid(KEY) == "uid-1"
    assert books.service_uid(KEY) is None, "a later publish applies the Service itself"
    books.applied_service_with_pods(KEY, "uid-2")
    books.forget(KEY)
    assert books.service_uid(KEY) is None
