"""runPolicy.maxRunSeconds: the pods carry the bound, the lifecycle stops the gang at it,
counted from the release (not the job's start), and the placer hands it to the queue."""

from __future__ import annotations

from datetime import timedelta

import pytest
from factories import NOW, ago, make_body, make_job, make_pod, make_pod_body

from trainwave import contract
from trainwave.builders.pods import build_worker_pods
from trainwave.controller.placement_inputs import run_bounds, running_gang
from trainwave.lifecycle.decide import decide
from trainwave.placement.records import pod_record
from trainwave.resolving import resolve, resolve_job

pytestmark = pytest.mark.timeout(10)

RUNNING = {"phase": "Running", "start_time": ago(1_000)}


def gang(released: float, bound: int | None = 60, *, later: float | None = None):
    """Two running workers released `released` seconds ago (worker 1 `later` if given)."""
    return [
        make_pod(0, released_at=ago(released), max_run_seconds=bound),
        make_pod(1, released_at=ago(later if later is not None else released),
                 max_run_seconds=bound),
    ]  # fmt: skip


def test_the_gang_fails_once_it_ran_its_bound_after_release() -> None:
    decision = decide(resolve_job(make_job(**RUNNING)), gang(released=61), NOW)
    assert decision.status.phase == "Failed"
    assert decision.status.reason == "DeadlineExceeded"
    assert decision.status.message.startswith(
        "the gang ran longer than runPolicy.maxRunSeconds (60s) after it was placed"
    )
    assert sorted(decision.delete_pods) == sorted(p.name for p in gang(released=61))


def test_time_in_the_queue_does_not_count() -> None:
    """The job started 1,000 s ago; its gang was released 20 s ago: 40 s are left."""
    decision = decide(resolve_job(make_job(**RUNNING)), gang(released=20), NOW)
    assert decision.status.phase == "Running"
    assert decision.requeue_after == pytest.approx(40.0)


def test_the_earliest_release_of_the_attempt_starts_the_clock() -> None:
    """A worker replaced alone is released later; the gang's clock is its first release."""
    decision = decide(resolve_job(make_job(**RUNNING)), gang(released=70, later=5), NOW)
    assert decision.status.phase == "Failed"


def test_pods_without_the_bound_run_on() -> None:
    decision = decide(resolve_job(make_job(**RUNNING)), gang(released=10_000, bound=None), NOW)
    assert decision.status.phase == "Running"


def test_the_builder_writes_the_bound_on_every_worker_and_only_when_set() -> None:
    body = make_body(**RUNNING)
    body["spec"]["runPolicy"]["maxRunSeconds"] = 90
    resolved = resolve(body)
    pods = build_worker_pods(resolved, (0, 1), 0)
    assert [p["metadata"]["annotations"][contract.ANNOTATION_MAX_RUN_SECONDS] for p in pods] == [
        "90", "90",
    ]  # fmt: skip
    del body["spec"]["runPolicy"]["maxRunSeconds"]
    template = body["spec"].setdefault("template", {})
    # A template may not promise a bound the job did not set.
    template.setdefault("metadata", {})["annotations"] = {contract.ANNOTATION_MAX_RUN_SECONDS: "5"}
    [pod] = build_worker_pods(resolve(body), (0,), 0)
    assert contract.ANNOTATION_MAX_RUN_SECONDS not in pod["metadata"]["annotations"]


def test_the_placer_reads_the_gangs_end_from_its_pods() -> None:
    released = NOW - timedelta(seconds=30)
    bodies = [
        make_pod_body(0, released_at=released, max_run_seconds=100),
        make_pod_body(1, released_at=released + timedelta(seconds=10), max_run_seconds=100),
    ]
    records = [r for b in bodies if (r := pod_record(b)) is not None]
    assert records[0].worker is not None
    assert records[0].worker.run_until == pytest.approx(released.timestamp() + 100)
    running = running_gang(("default", "demo"), records)
    assert running is not None
    assert running.run_until == pytest.approx(released.timestamp() + 100)  # the earliest
    bounds = run_bounds([running], NOW.timestamp())
    [bounded] = bounds.gangs
    assert bounded.end == running.run_until
    assert bounded.workers_by_node == (("node-0", 1), ("node-1", 1))


def test_unbounded_and_unreleased_gangs_never_end_in_the_queues_count() -> None:
    unbounded = [r for b in (make_pod_body(0, released_at=NOW),) if (r := pod_record(b))]
    unreleased = [r for b in (make_pod_body(0, max_run_seconds=5),) if (r := pod_record(b))]
    gangs = [running_gang(("default", "demo"), pods) for pods in (unbounded, unreleased)]
    assert all(g is not None and g.run_until is None for g in gangs)
    assert run_bounds([g for g in gangs if g], NOW.timestamp()).gangs == ()
