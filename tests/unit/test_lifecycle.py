"""The job state machine: decision tables for `decide`, conditions, and idempotence."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from factories import NOW, ago, make_job, make_pod, make_pod_body, pod_name, rule, running

from trainwave.api.status import Condition, ConditionType, Phase
from trainwave.api.trainingjob import TrainingJob
from trainwave.lifecycle.conditions import clear_condition, set_condition
from trainwave.lifecycle.decide import Decision, decide, decide_invalid
from trainwave.lifecycle.observed import WorkerPod, observe_pod
from trainwave.resolving import resolve_job

pytestmark = pytest.mark.timeout(10)

START = ago(100)


def failed(rank: int, code: int | None = 1, attempt: int = 0, at: float = 5) -> WorkerPod:
    return make_pod(rank, attempt, phase="Failed", ready=False, exit_code=code, finished_at=ago(at))


def done(rank: int, attempt: int = 0) -> WorkerPod:
    return make_pod(rank, attempt, phase="Succeeded", ready=False, exit_code=0, finished_at=ago(1))


def pending(rank: int, attempt: int = 0, bound: bool = False) -> WorkerPod:
    return make_pod(rank, attempt, phase="Pending", ready=False, bound=bound)


# (job kwargs, observed pods, expected). Expected keys: phase, reason, create, delete
# (pod names), events ([(type, reason)]), attempt, restarts, requeue, delete_job.
RUNNING: dict[str, Any] = {"phase": "Running", "start_time": START}
CASES = [
    pytest.param({}, [], {"phase": "Pending", "reason": "CreatingWorkers", "create": (0, 1),
                          "events": [("Normal", "Created")]}, id="new-job"),
    pytest.param({"phase": "Pending", "start_time": START}, [pending(0)],
                 {"phase": "Pending", "create": (1,), "events": []}, id="one-missing"),
    pytest.param({"phase": "Pending", "start_time": START}, [pending(0), pending(1)],
                 {"phase": "Scheduling", "reason": "WaitingForNodes",
                  "events": [("Normal", "WaitingForNodes")]}, id="all-unbound"),
    pytest.param({"phase": "Scheduling", "start_time": START},
                 [pending(0, bound=True), pending(1, bound=True)],
                 {"phase": "Starting", "events": [("Normal", "WorkersStarting")]},
                 id="bound-not-running"),
    pytest.param({"phase": "Starting", "start_time": START}, running(),
                 {"phase": "Running", "reason": "AllWorkersRunning",
                  "events": [("Normal", "AllWorkersRunning")]}, id="all-running"),
    pytest.param(RUNNING, running(), {"phase": "Running", "events": []}, id="still-running"),
    pytest.param(RUNNING, [make_pod(0), failed(1)],
                 {"phase": "Restarting", "reason": "WorkerFailed", "attempt": 1, "restarts": 1,
                  "delete": [pod_name(0)], "events": [("Warning", "WorkerFailed")]},
                 id="worker-failed-restarts-gang"),
    pytest.param({**RUNNING, "restarts": 3}, [make_pod(0), failed(1)],
                 {"phase": "Failed", "reason": "MaxRestartsExceeded", "attempt": 0, "restarts": 3,
                  "delete": [pod_name(0)], "events": [("Warning", "MaxRestartsExceeded")]},
                 id="max-restarts-exceeded"),
    pytest.param({**RUNNING, "max_restarts": 0}, [failed(0), failed(1)],
                 {"phase": "Failed", "reason": "MaxRestartsExceeded", "delete": []},
                 id="max-restarts-zero"),
    pytest.param({**RUNNING, "rules": (rule("FailJob", "In", 2),)}, [make_pod(0), failed(1, 2)],
                 {"phase": "Failed", "reason": "FailedByRule", "delete": [pod_name(0)]},
                 id="fail-job-rule"),
    pytest.param({**RUNNING, "restarts": 3, "rules": (rule("Ignore", "In", 137),)},
                 [make_pod(0), failed(1, 137)],
                 {"phase": "Restarting", "attempt": 1, "restarts": 3}, id="ignore-not-counted"),
    pytest.param({**RUNNING, "rules": (rule("RestartGang", "In", 3),)}, [failed(0, 3)],
                 {"phase": "Restarting", "restarts": 1}, id="restart-gang-rule-counted"),
    pytest.param({**RUNNING, "rules": (rule("FailJob", "NotIn", 1),)}, [failed(0, 2)],
                 {"phase": "Failed", "reason": "FailedByRule"}, id="not-in-matches-other-code"),
    pytest.param({**RUNNING, "rules": (rule("FailJob", "NotIn", 1),)}, [failed(0, 1)],
                 {"phase": "Restarting", "restarts": 1}, id="not-in-skips-listed-code"),
    pytest.param({**RUNNING, "rules": (rule("FailJob", "NotIn", 1), rule("FailJob", "In", 1))},
                 [failed(0, None)], {"phase": "Restarting", "reason": "WorkerDisrupted",
                                     "restarts": 0},
                 id="evicted-no-exit-code-falls-to-default-disruption"),
    pytest.param({**RUNNING, "rules": (rule("Ignore", "In", 1), rule("FailJob", "In", 1))},
                 [failed(0, 1)], {"phase": "Restarting", "restarts": 0}, id="first-rule-wins"),
    pytest.param({**RUNNING, "rules": (rule("FailJob", "In", 2),)},
                 [failed(0, 1, at=5), failed(1, 2, at=10)],
                 {"phase": "Failed", "reason": "FailedByRule"}, id="earliest-failure-decides"),
    pytest.param({**RUNNING, "rules": (rule("FailJob", "In", 2),)},
                 [failed(0, 1, at=10), failed(1, 2, at=5)],
                 {"phase": "Restarting"}, id="later-failure-ignored"),
    pytest.param(RUNNING, [done(0), done(1)],
                 {"phase": "Succeeded", "reason": "Succeeded", "delete": [],
                  "events": [("Normal", "Succeeded")]}, id="all-workers-succeeded"),
    pytest.param(RUNNING, [done(0), make_pod(1)], {"phase": "Running", "delete": []},
                 id="all-workers-one-still-running"),
    pytest.param({**RUNNING, "success_policy": "Rank0"}, [done(0), make_pod(1)],
                 {"phase": "Succeeded", "delete": [pod_name(1)]}, id="rank0-succeeded"),
    pytest.param({**RUNNING, "success_policy": "Rank0"}, [make_pod(0), done(1)],
                 {"phase": "Running", "delete": []}, id="rank0-waits-for-rank0"),
    pytest.param({**RUNNING, "success_policy": "Rank0"}, [done(0), failed(1)],
                 {"phase": "Succeeded", "delete": []}, id="rank0-peer-failed-after-success"),
    pytest.param({**RUNNING, "active_deadline_seconds": 60}, running(),
                 {"phase": "Failed", "reason": "DeadlineExceeded",
                  "delete": [pod_name(0), pod_name(1)]}, id="deadline-exceeded"),
    pytest.param({**RUNNING, "active_deadline_seconds": 130}, running(),
                 {"phase": "Running", "requeue": 30.0}, id="deadline-ahead-requeues"),
    pytest.param({**RUNNING, "suspend": True}, [make_pod(0), done(1)],
                 {"phase": "Suspended", "delete": [pod_name(0)],
                  "events": [("Normal", "Suspended")]}, id="suspend"),
    pytest.param({"phase": "Suspended", "attempt": 2}, [make_pod(0, 2, deleting=True)],
                 {"phase": "Pending", "reason": "CreatingWorkers", "attempt": 3, "create": (0, 1),
                  "delete": [], "events": [("Normal", "Resumed")]}, id="resume"),
    pytest.param({"phase": "Succeeded", "completion_time": ago(1)}, [done(0), make_pod(1)],
                 {"phase": "Succeeded", "delete": [pod_name(1)], "events": []},
                 id="terminal-stops-active-keeps-finished"),
    pytest.param({"phase": "Failed", "completion_time": ago(10), "ttl": 60}, [],
                 {"phase": "Failed", "requeue": 50.0, "delete_job": False}, id="ttl-ahead"),
    pytest.param({"phase": "Succeeded", "completion_time": ago(60), "ttl": 60}, [done(0)],
                 {"delete_job": True, "requeue": None}, id="ttl-passed"),
    pytest.param({"phase": "Pending", "start_time": START},
                 [make_pod(0, owner_uid="uid-old"),
                  make_pod(1, phase="Failed", exit_code=1, owner_uid="uid-old")],
                 {"phase": "Pending", "create": (0, 1), "delete": []}, id="other-uid-ignored"),
    pytest.param({"phase": "Restarting", "attempt": 1, "start_time": START},
                 [make_pod(0), failed(1)],
                 {"phase": "Restarting", "create": (0, 1), "delete": [pod_name(0)], "events": []},
                 id="stale-active-pods-deleted"),
    pytest.param({"phase": "Running", "attempt": 2, "start_time": START},
                 [failed(0, attempt=0), failed(1, attempt=1), make_pod(0, 2), make_pod(1, 2),
                  make_pod(1, 0, deleting=True)],
                 {"phase": "Running", "delete": [pod_name(0, 0)]}, id="old-finished-pods-deleted"),
    pytest.param(RUNNING, [make_pod(0)],
                 {"phase": "Restarting", "reason": "WorkerFailed", "attempt": 1, "restarts": 1,
                  "create": (), "delete": [pod_name(0)]}, id="vanished-worker-restarts-gang"),
    pytest.param(RUNNING, [make_pod(0), make_pod(1, deleting=True)],
                 {"phase": "Restarting", "attempt": 1, "restarts": 1, "delete": [pod_name(0)]},
                 id="worker-deleted-by-someone-restarts-gang"),
    pytest.param({**RUNNING, "restarts": 3}, [make_pod(0)],
                 {"phase": "Failed", "reason": "MaxRestartsExceeded"}, id="lost-worker-past-budget"),
    pytest.param({"phase": "Pending", "start_time": START}, [make_pod(0)],
                 {"phase": "Pending", "create": (1,), "restarts": 0},
                 id="missing-while-pending-is-created-not-lost"),
]  # fmt: skip


def check(decision: Decision, expected: dict[str, Any]) -> None:
    status = decision.status
    actual = {
        "phase": status.phase,
        "reason": status.reason,
        "create": decision.create_ranks,
        "delete": list(decision.delete_pods),
        "events": [(e.type, e.reason) for e in decision.events],
        "attempt": status.attempt,
        "restarts": status.restarts,
        "requeue": decision.requeue_after,
        "delete_job": decision.delete_job,
    }
    assert {k: actual[k] for k in expected} == expected


@pytest.mark.parametrize(("job", "pods", "expected"), CASES)
def test_decide(job: dict[str, Any], pods: list[WorkerPod], expected: dict[str, Any]) -> None:
    decision = decide(resolve_job(make_job(**job)), pods, NOW)
    check(decision, expected)
    assert decision.status.observed_generation == 1
    if "create" not in expected:
        assert decision.create_ranks == ()


def test_new_job_starts_the_clock_and_is_created() -> None:
    status = decide(resolve_job(make_job()), [], NOW).status
    assert status.start_time == NOW
    created = status.condition(ConditionType.CREATED)
    assert created is not None
    assert (created.status, created.last_transition_time) == ("True", NOW)
    assert (status.total_workers, status.ready) == (2, "0/2")


def test_all_running_after_counts_from_the_current_gang_not_the_first_start() -> None:
    job = make_job(phase="Starting", start_time=ago(500), attempt=1)
    job = job.model_copy(
        update={"status": job.status.model_copy(update={"attempt_start_time": ago(7)})}
    )
    decision = decide(resolve_job(job), running(attempt=1), NOW)
    assert decision.all_running_after == pytest.approx(7)


def test_a_status_lost_after_the_workers_were_created_gets_its_start_times_back() -> None:
    """An operator restarted before it wrote the status it held: the workers are there."""
    decision = decide(resolve_job(make_job()), running(), NOW)
    assert decision.create_ranks == ()
    assert (decision.status.start_time, decision.status.attempt_start_time) == (NOW, NOW)


def test_all_running_after_is_measured_once() -> None:
    first = decide(resolve_job(make_job(phase="Starting", start_time=ago(42))), running(), NOW)
    assert first.all_running_after == 42.0
    assert first.status.all_running_time == NOW
    again = decide(resolve_job(make_job(phase="Running", start_time=ago(42))), running(), NOW)
    assert again.all_running_after is None


def test_running_status_counts_ready_workers_and_gpus() -> None:
    pods = [make_pod(0), make_pod(1, ready=False), pending(2, bound=True)]
    status = decide(
        resolve_job(make_job(workers=3, gpus_per_worker=8, phase="Starting")), pods, NOW
    ).status
    assert (status.ready_workers, status.ready, status.gpus) == (1, "1/3", 24)


def test_restart_message_names_the_culprit_and_the_count() -> None:
    decision = decide(resolve_job(make_job(**RUNNING)), [make_pod(0), failed(1, 7)], NOW)
    assert decision.status.message == (
        "worker 1 (demo-a0-worker-1) exited with code 7; restarting the gang (restart 1 of 3)"
    )
    restarting = decision.status.condition(ConditionType.RESTARTING)
    assert restarting is not None
    assert restarting.status == "True"


def test_rule_verdict_message_names_the_rule() -> None:
    job = make_job(**RUNNING, rules=(rule("Ignore", "In", 9), rule("FailJob", "In", 2)))
    message = decide(resolve_job(job), [failed(0, 2)], NOW).status.message
    assert message.endswith("(failurePolicy.rules[1]: FailJob); the job failed")


def test_failure_completes_the_job() -> None:
    status = decide(
        resolve_job(make_job(**RUNNING, active_deadline_seconds=1)), running(), NOW
    ).status
    assert (status.completion_time, status.gpus, status.ready_workers) == (NOW, 0, 0)
    failed_condition = status.condition(ConditionType.FAILED)
    assert failed_condition is not None
    assert failed_condition.reason == "DeadlineExceeded"


def test_decide_invalid_fails_once_and_stops_pods() -> None:
    job = make_job(phase="Running")
    pods = [make_pod(0), done(1), make_pod(0, owner_uid="other")]
    first = decide_invalid(job.metadata, job.status, pods, "spec.x: bad", NOW)
    check(first, {"phase": "Failed", "reason": "InvalidSpec", "delete": [pod_name(0)],
                  "events": [("Warning", "InvalidSpec")]})  # fmt: skip
    assert first.status.message == "spec.x: bad"
    again = decide_invalid(job.metadata, first.status, pods, "spec.x: bad", NOW)
    assert (again.events, again.status) == ((), first.status)


# --- conditions ---------------------------------------------------------------------------


def _set(conditions: list[Condition], kind: ConditionType, true: bool, at: int) -> list[Condition]:
    return set_condition(conditions, kind, true=true, reason="R", message=f"m{at}",
                         now=NOW + timedelta(seconds=at), generation=at)  # fmt: skip


def test_conditions_are_keyed_by_type_and_transition_only_on_change() -> None:
    conditions = _set([], ConditionType.RUNNING, True, 1)
    conditions = _set(conditions, ConditionType.CREATED, True, 2)
    assert [c.type for c in conditions] == [ConditionType.CREATED, ConditionType.RUNNING]
    conditions = _set(conditions, ConditionType.RUNNING, True, 3)
    (running_condition,) = [c for c in conditions if c.type == ConditionType.RUNNING]
    assert running_condition.last_transition_time == NOW + timedelta(seconds=1)
    assert (running_condition.message, running_condition.observed_generation) == ("m3", 3)
    conditions = _set(conditions, ConditionType.RUNNING, False, 4)
    assert len(conditions) == 2
    assert conditions[1].last_transition_time == NOW + timedelta(seconds=4)


def test_clear_condition_leaves_absent_conditions_absent() -> None:
    kwargs: dict[str, Any] = {"reason": "R", "message": "m", "now": NOW, "generation": 1}
    assert clear_condition([], ConditionType.RUNNING, **kwargs) == []
    present = _set([], ConditionType.RUNNING, True, 0)
    (cleared,) = clear_condition(present, ConditionType.RUNNING, **kwargs)
    assert cleared.status == "False"


def test_condition_time_does_not_move_across_reconciles() -> None:
    first = decide(resolve_job(make_job(phase="Starting", start_time=START)), running(), NOW)
    later = make_job(phase="Running", start_time=START).model_copy(update={"status": first.status})
    second = decide(resolve_job(later), running(), NOW + timedelta(minutes=5))
    assert second.status.conditions == first.status.conditions
    assert second.events == ()


# --- idempotence --------------------------------------------------------------------------


def with_status(job: TrainingJob, decision: Decision) -> TrainingJob:
    return job.model_copy(update={"status": decision.status})


@pytest.mark.parametrize(("job", "pods", "expected"), CASES)
def test_decide_is_idempotent(
    job: dict[str, Any], pods: list[WorkerPod], expected: dict[str, Any]
) -> None:
    """Replaying a decision's status against the same pods adds no news.

    A restart writes its new attempt before creating the new gang, so the replay
    may create that gang; from then on nothing changes at all.
    """
    del expected
    start = make_job(**job)
    first = decide(resolve_job(start), pods, NOW)
    if first.delete_job:
        return
    second = decide(resolve_job(with_status(start, first)), pods, NOW)
    assert second.events == ()
    assert second.all_running_after is None
    if first.status.attempt == start.status.attempt:
        assert second.status == first.status
        assert second.create_ranks == first.create_ranks
    assert set(second.delete_pods) >= set(first.delete_pods), "unapplied deletes are asked again"
    third = decide(resolve_job(with_status(start, second)), pods, NOW)
    assert third == second


def test_a_gang_lives_through_a_restart_to_success() -> None:
    """Drive one job through a scripted cluster; each step feeds the last status back."""
    job = make_job(workers=2, gpus_per_worker=1)
    phases: list[Phase | None] = []
    events: list[str] = []

    def step(pods: list[WorkerPod], seconds: int) -> Decision:
        nonlocal job
        decision = decide(resolve_job(job), pods, NOW + timedelta(seconds=seconds))
        job = with_status(job, decision)
        phases.append(decision.status.phase)
        events.extend(e.reason for e in decision.events)
        return decision

    assert step([], 0).create_ranks == (0, 1)
    step([pending(0), pending(1)], 1)
    step([pending(0, bound=True), pending(1, bound=True)], 2)
    assert step(running(), 10).all_running_after == 10.0
    assert step([make_pod(0), failed(1)], 20).delete_pods == (pod_name(0),)
    assert step([failed(1)], 21).create_ranks == (0, 1), "the new gang, under new names"
    restarted = step([failed(1), *running(attempt=1)], 30)
    assert restarted.all_running_after is not None, "observed once per attempt"
    finished = step([failed(1), done(0, 1), done(1, 1)], 40)
    assert finished.delete_pods == (), "the last attempt's failed pod stays for its logs"
    assert phases == ["Pending", "Scheduling", "Starting", "Running", "Restarting", "Restarting",
                      "Running", "Succeeded"]  # fmt: skip
    assert events == ["Created", "WaitingForNodes", "WorkersStarting", "AllWorkersRunning",
                      "WorkerFailed", "AllWorkersRunning", "Succeeded"]  # fmt: skip
    status = job.status
    assert (status.attempt, status.restarts, status.gpus) == (1, 1, 0)
    assert status.completion_time == NOW + timedelta(seconds=40)
    kinds = {c.type: c.status for c in status.conditions}
    assert kinds == {"Created": "True", "Scheduled": "True", "Running": "False",
                     "Restarting": "False", "Succeeded": "True"}  # fmt: skip


# --- children the API server refuses ------------------------------------------------------


def test_a_refused_worker_is_a_condition_an_event_once_and_clears_when_all_exist() -> None:
    from trainwave.lifecycle.children import creating_failed

    job = make_job(phase="Pending")
    first = creating_failed(job.metadata, job.status, "pod ns/w-1", "exceeded quota: q", NOW)
    failing = first.status.condition(ConditionType.REPLICA_FAILURE)
    assert failing is not None
    assert (failing.status, failing.reason) == ("True", "FailedCreate")
    assert first.status.message == "creating pod ns/w-1 failed: exceeded quota: q"
    assert [e.reason for e in first.events] == ["FailedCreate"]
    again = creating_failed(job.metadata, first.status, "pod ns/w-1", "exceeded quota: q", NOW)
    assert again.events == (), "the same refusal is not announced twice"

    later = job.model_copy(update={"status": again.status})
    cleared = decide(resolve_job(later), running(), NOW).status.condition(
        ConditionType.REPLICA_FAILURE
    )
    assert cleared is not None
    assert cleared.status == "False"


def test_the_service_is_wanted_once_every_worker_of_the_attempt_has_an_address() -> None:
    """Until it is observed; created earlier, its endpoints would be rewritten as each
    worker got its address."""
    scheduling = make_job(phase="Scheduling", start_time=START)
    gated = [make_pod(r, phase="Pending", bound=False, gated=True) for r in (0, 1)]
    assert not decide(resolve_job(scheduling), gated, NOW).wants_service
    one = [make_pod(0, phase="Pending", pod_ip="10.0.0.1"), make_pod(1, phase="Pending")]
    assert not decide(resolve_job(scheduling), one, NOW).wants_service
    both = [make_pod(r, phase="Pending", pod_ip=f"10.0.0.{r + 1}") for r in (0, 1)]
    starting = decide(resolve_job(scheduling), both, NOW)
    assert (starting.status.phase, starting.wants_service) == (Phase.STARTING, True)
    assert [(e.rank, e.address) for e in starting.service_endpoints] == [
        (0, "10.0.0.1"),
        (1, "10.0.0.2"),
    ]
    up = [make_pod(r, pod_ip=f"10.0.0.{r + 1}") for r in (0, 1)]
    assert decide(resolve_job(make_job(**RUNNING)), up, NOW).wants_service
    assert not decide(resolve_job(make_job(**RUNNING)), up, NOW, service_exists=True).wants_service
    broken = [up[0], failed(1)]
    restarting = decide(resolve_job(make_job(**RUNNING)), broken, NOW)
    assert (restarting.status.phase, restarting.wants_service) == (Phase.RESTARTING, False)


def test_worker_0_s_address_is_published_before_the_other_workers_have_theirs() -> None:
    """Every other worker's torchrun asks for worker 0's name first; asked before a slice
    names it, the answer is NXDOMAIN, cached by CoreDNS (lifecycle/endpoints.py)."""
    scheduling = make_job(phase="Scheduling", start_time=START)
    one = [make_pod(0, phase="Pending", pod_ip="10.0.0.1"), make_pod(1, phase="Pending")]
    early = decide(resolve_job(scheduling), one, NOW, host_unpublished=True)
    assert early.wants_service
    assert [(e.rank, e.address) for e in early.service_endpoints] == [(0, "10.0.0.1")]
    # Published: the rest waits for every address, as before, then one more write.
    assert not decide(resolve_job(scheduling), one, NOW, host_unpublished=False).wants_service
    assert not decide(
        resolve_job(scheduling), one, NOW, service_exists=True, host_unpublished=True
    ).wants_service


def test_endpoints_naming_another_attempt_are_written_again_before_the_new_gang_exists() -> None:
    """The old gang's pods, terminating, must not answer for the new gang's hostnames
    (builders/service.py): their names go at once, not when the new gang has addresses."""
    restarted = make_job(phase="Restarting", start_time=START, attempt=1, restarts=1)
    old_gang = [make_pod(r, attempt=0, deleting=True) for r in (0, 1)]
    stale = decide(resolve_job(restarted), old_gang, NOW, service_stale=True)
    assert stale.wants_service
    assert stale.service_endpoints == (), "no name leads to the old gang any more"
    assert not decide(resolve_job(restarted), old_gang, NOW).wants_service


def waiting_body(rank: int, reason: str, message: str = "", init: bool = False) -> dict[str, Any]:
    """A bound, Pending worker whose container (or the runtime's init container) waits."""
    body = make_pod_body(rank, phase="Pending", ready=False)
    state: dict[str, Any] = {"waiting": {"reason": reason, "message": message}}
    if init:  # the worker container waits for the init container
        body["status"]["initContainerStatuses"] = [{"name": "runtime", "state": state}]
        state = {"waiting": {"reason": "PodInitializing"}}
    body["status"]["containerStatuses"] = [{"name": "worker", "state": state}]
    return body


@pytest.mark.parametrize(
    ("reason", "init", "said"),
    [
        ("ContainerCreating", False, ""),
        ("PodInitializing", False, ""),
        ("ImagePullBackOff", False, 'container worker waiting: ImagePullBackOff: pull "x:1"'),
        ("CreateContainerConfigError", True,
         'container runtime waiting: CreateContainerConfigError: pull "x:1"'),
    ],
    ids=["creating", "initializing", "image-pull", "init-config"],
)  # fmt: skip
def test_a_container_the_kubelet_cannot_start_is_named(reason: str, init: bool, said: str) -> None:
    pod = observe_pod(waiting_body(0, reason, 'pull "x:1"', init=init))
    assert pod is not None
    assert pod.stuck == said


def test_a_pull_backing_off_is_named_by_the_pull_that_failed() -> None:
    """The kubelet alternates ErrImagePull and ImagePullBackOff while it retries; the back-off
    wraps the failed pull's words, so the job says the same thing through both."""
    failed = 'failed to pull and unpack image "nope:1": not found'
    pulling = observe_pod(waiting_body(0, "ErrImagePull", failed))
    backing_off = observe_pod(
        waiting_body(
            0, "ImagePullBackOff", f'Back-off pulling image "nope:1": ErrImagePull: {failed}'
        )
    )
    older_kubelet = observe_pod(
        waiting_body(0, "ImagePullBackOff", 'Back-off pulling image "nope:1"')
    )
    assert pulling is not None
    assert backing_off is not None
    assert older_kubelet is not None
    assert backing_off.stuck == pulling.stuck == f"container worker waiting: ErrImagePull: {failed}"
    assert older_kubelet.stuck == (
        'container worker waiting: ImagePullBackOff: Back-off pulling image "nope:1"'
    )


def test_a_stuck_worker_is_named_on_the_starting_job() -> None:
    """As a Job's pod stays Pending with a mistyped image, the gang stays Starting; the
    job's message says which worker and what the kubelet said, not only a count."""
    stuck = observe_pod(waiting_body(1, "ErrImagePull", 'failed to pull "nope:1"'))
    assert stuck is not None
    job = make_job(phase="Starting", start_time=START)
    status = decide(resolve_job(job), [pending(0, bound=True), stuck], NOW).status
    assert status.phase == Phase.STARTING
    assert status.message == (
        f"0/2 workers running; worker 1 ({pod_name(1)}): container worker waiting: "
        'ErrImagePull: failed to pull "nope:1"'
    )


def test_a_worker_sitting_on_its_node_is_named_with_what_its_events_say() -> None:
    """A pod whose volume does not mount sits Pending with its containers creating: what
    the reconciler read from its Events names it; a gang whose workers say nothing shows
    the count alone."""
    job = make_job(phase="Starting", start_time=START)
    sitting = replace(pending(1, bound=True), event_says='FailedMount: configmap "cfg" not found')
    status = decide(resolve_job(job), [pending(0, bound=True), sitting], NOW).status
    assert status.phase == Phase.STARTING
    assert status.message == (
        f'0/2 workers running; worker 1 ({pod_name(1)}): FailedMount: configmap "cfg" not found'
    )
    quiet = decide(resolve_job(job), [pending(0, bound=True), pending(1, bound=True)], NOW)
    assert quiet.status.message == "0/2 workers running"


@pytest.mark.parametrize(
    ("reason", "said"),
    [
        ("Unschedulable", "not scheduled: Unschedulable: 0/9 nodes are available: "
                          "9 node(s) didn't match pod affinity rules."),
        ("SchedulingGated", ""),  # trainwave's own gate: the job says why it waits
    ],
    ids=["unschedulable", "gated"],
)  # fmt: skip
def test_a_pod_kube_scheduler_cannot_place_is_named(reason: str, said: str) -> None:
    scheduled = {"type": "PodScheduled", "status": "False", "reason": reason,
                 "message": "0/9 nodes are available:\n 9 node(s) didn't match pod affinity rules."}  # fmt: skip
    body = make_pod_body(0, phase="Pending", ready=False, bound=False, conditions=(scheduled,))
    pod = observe_pod(body)
    assert pod is not None
    assert pod.stuck == said


def test_a_worker_kube_scheduler_cannot_bind_is_named_on_the_scheduling_job() -> None:
    job = make_job(phase="Scheduling", start_time=START)
    refused = replace(pending(1), stuck="not scheduled: Unschedulable: 0/9 nodes are available")
    status = decide(resolve_job(job), [pending(0, bound=True), refused], NOW).status
    assert status.phase == Phase.SCHEDULING
    said = f"1/2 workers bound to nodes; worker 1 ({pod_name(1)}): not scheduled: Unschedulable"
    assert status.message.startswith(said), status.message
    scheduled = status.condition(ConditionType.SCHEDULED)
    assert scheduled is not None
    assert scheduled.message == status.message
