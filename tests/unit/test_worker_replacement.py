"""Replace one worker, not the gang (runPolicy.workerReplacement, lifecycle/replacing.py):
which workers are replaced alone, when the gang is recreated instead and why, and how a
replacement is followed through to its end or its timeout."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from factories import NOW, ago, make_body, make_pod, make_pod_body

from trainwave import contract
from trainwave.api.reasons import Reason
from trainwave.api.status import ConditionType, Phase
from trainwave.api.trainingjob import parse_trainingjob
from trainwave.builders.pods import build_worker_pods
from trainwave.controller.executing import with_status
from trainwave.controller.placement_inputs import gang_domains
from trainwave.lifecycle.decide import Decision, decide
from trainwave.lifecycle.failures import Incident
from trainwave.lifecycle.observed import NodeHealth, WorkerPod, observe_pod
from trainwave.lifecycle.replacing import judge_replacement
from trainwave.resolving import resolve_job

pytestmark = pytest.mark.timeout(20)

RUNNING: dict[str, Any] = {
    "conditions": [{"type": "Running", "status": "True", "reason": "AllWorkersRunning"}]
}
NOT_READY = NodeHealth(present=True, ready=False, not_ready_since=ago(120))


def body(
    *, workers: int = 2, runtime: dict[str, Any] | None = None, status: dict[str, Any] | None = None,
    replacement: dict[str, Any] | None = None, phase: str = "Running", **options: Any,
) -> dict[str, Any]:  # fmt: skip
    """A Running job with the runtime (in-place restarts 3 by default) unless `runtime` says."""
    made = make_body(
        workers=workers, phase=phase, start_time=ago(600),
        status_extra={**RUNNING, **(status or {})},
        runtime={} if runtime is None else runtime, command=["python", "train.py"], **options,
    )  # fmt: skip
    if replacement is not None:
        made["spec"]["runPolicy"]["workerReplacement"] = replacement
    if runtime == {"none": True}:
        del made["spec"]["runtime"]
    return made


def gang(workers: int = 2, **per_rank: dict[str, Any]) -> list[WorkerPod]:
    """Running workers with UIDs uid-0, uid-1... on node-0, node-1...; per_rank["r1"]
    overrides worker 1's make_pod options."""
    pods = []
    for rank in range(workers):
        options = per_rank.get(f"r{rank}", {})
        pods.append(replace(make_pod(rank, **options), uid=f"uid-{rank}"))
    return pods


def run(made: dict[str, Any], pods: list[WorkerPod], **options: Any) -> Decision:
    return decide(resolve_job(parse_trainingjob(made)), pods, NOW, **options)


def lose_node_1(made: dict[str, Any] | None = None) -> Decision:
    return run(made or body(), gang(), nodes={"node-1": NOT_READY})


def test_a_worker_whose_node_went_not_ready_is_replaced_alone() -> None:
    found = lose_node_1()
    status = found.status
    assert (status.attempt, status.disruptions, status.restarts) == (0, 1, 0)
    assert found.force_delete_pods == ("demo-a0-worker-1",)  # no kubelet will confirm
    assert found.delete_pods == ()  # worker 0 keeps its pod
    assert found.create_ranks == ()  # in the next reconcile, from the status written first
    assert status.replacements is not None
    (pending,) = status.replacements.pending
    assert (pending.rank, pending.pod_uid, pending.node, pending.cause) == (
        1, "uid-1", "node-1", "disruption",
    )  # fmt: skip
    assert (status.replacements.total, status.replacements.in_attempt) == (1, 1)
    assert pending.serial == 1  # the new pod's name ends with it
    assert (status.phase, status.reason) == (Phase.RESTARTING, Reason.REPLACING_WORKER)
    condition = status.condition(ConditionType.WORKER_REPLACEMENT)
    assert condition is not None
    assert condition.status == "True"
    (event,) = [e for e in found.events if e.reason == Reason.REPLACING_WORKER]
    assert event.type == "Warning"
    assert "worker 1 (demo-a0-worker-1) lost its node node-1 (NodeNotReady)" in event.message
    assert "replacing only worker 1, the other workers (0) keep their pods" in event.message
    assert "disruption 1 of 20; 1 of 3 in-place restarts and replacements" in event.message


def test_worker_0_the_store_host_is_replaced_alone_too() -> None:
    # Its agent hosts the rendezvous store; the others' launchers start their agents again
    # to meet the new worker 0's store (runtime/launcher/rejoin.py).
    found = run(body(), gang(), nodes={"node-0": NOT_READY})
    assert (found.status.attempt, found.status.disruptions) == (0, 1)
    assert (found.force_delete_pods, found.delete_pods) == (("demo-a0-worker-0",), ())
    assert found.status.replacements is not None
    assert [p.rank for p in found.status.replacements.pending] == [0]


def test_an_evicted_worker_is_replaced_without_a_force_delete() -> None:
    evicted = {"conditions": ({"type": "DisruptionTarget", "status": "True",
                               "reason": "EvictionByEvictionAPI"},), "deleting": True}  # fmt: skip
    found = run(body(), gang(r1=evicted))
    assert (found.status.attempt, found.status.disruptions) == (0, 1)
    assert (found.force_delete_pods, found.delete_pods) == ((), ())  # already going


def test_a_deleted_worker_is_replaced_as_a_disruption_not_a_failure() -> None:
    found = run(body(), gang(r1={"deleting": True}))
    assert (found.status.attempt, found.status.disruptions, found.status.restarts) == (0, 1, 0)
    assert found.status.replacements is not None


def test_a_worker_seen_failed_after_its_deletion_was_taken_and_is_replaced_alone() -> None:
    # The operator saw the delete late: the kubelet had already stopped the container for
    # it (SIGTERM, exit 1) and the pod shows Failed, 2 s after the delete was asked for.
    killed = {"deleting": True, "phase": "Failed", "exit_code": 1, "finished_at": ago(28)}
    found = run(body(), gang(r1=killed))
    assert (found.status.attempt, found.status.disruptions, found.status.restarts) == (0, 1, 0)
    assert found.status.replacements is not None
    (pending,) = found.status.replacements.pending
    assert (pending.rank, pending.what) == (
        1,
        "worker 1 (demo-a0-worker-1) was deleted before it finished",
    )
    assert found.delete_pods == ()  # already going


@pytest.mark.parametrize("code", [143, 137])
def test_a_deleted_worker_that_exited_as_killed_was_taken_whenever_the_delete_was(
    code: int,
) -> None:
    # The kubelet's last delete (grace 0) moved deletionTimestamp past the container's
    # end; the exit code still says a signal ended it (the launcher reports SIGTERM as 143).
    killed = {"deleting": True, "phase": "Failed", "exit_code": code, "finished_at": ago(31)}
    pod = replace(make_pod(1, **killed), uid="uid-1", delete_asked_at=None)
    found = run(body(), [gang()[0], pod])
    assert (found.status.attempt, found.status.disruptions, found.status.restarts) == (0, 1, 0)


def test_an_oom_killed_worker_deleted_after_failed() -> None:
    oom = {"deleting": True, "phase": "Failed", "exit_code": 137, "finished_at": ago(31),
           "container_reason": "OOMKilled"}  # fmt: skip
    found = run(body(), gang(r1=oom))
    assert (found.status.attempt, found.status.restarts) == (1, 1)


def test_a_worker_that_failed_before_its_deletion_failed() -> None:
    # Its process ended on its own (31 s ago), and only then was the pod deleted (30 s ago).
    failed = {"deleting": True, "phase": "Failed", "exit_code": 1, "finished_at": ago(31)}
    found = run(body(), gang(r1=failed))
    assert (found.status.attempt, found.status.restarts) == (1, 1)
    assert "worker 1 failed rather than was taken" in found.status.message


@pytest.mark.parametrize(
    ("made", "pods", "nodes", "why"),
    [
        (body(runtime={"inPlaceRestarts": 0}), gang(), {"node-1": NOT_READY}, None),
        (body(runtime={"enabled": False}), gang(), {"node-1": NOT_READY}, None),
        (body(runtime={"none": True}), gang(), {"node-1": NOT_READY}, None),
        (body(replacement={"enabled": False}), gang(), {"node-1": NOT_READY}, None),
        (body(status={"goodput": {"counted": {"attempt": 0, "inPlaceRestarts": 3}}}), gang(),
         {"node-1": NOT_READY}, "this attempt used 3 of spec.runtime.inPlaceRestarts (3)"),
        (body(), gang(r1={"phase": "Failed", "exit_code": 1}), {},
         "worker 1 failed rather than was taken"),
        (body(workers=4), gang(4), {"node-1": NOT_READY, "node-2": NOT_READY,
                                    "node-3": NOT_READY}, "3 of 4 workers lost"),
        (body(workers=1), gang(1), {"node-0": NOT_READY},
         "every worker of the gang (1) is in trouble"),
    ],
    ids=["in-place-off", "runtime-off", "no-runtime", "policy-off", "bound-used",
         "process-failed", "most-of-the-gang", "gang-of-one"],
)  # fmt: skip
def test_otherwise_the_gang_is_recreated_and_says_why(
    made: dict[str, Any], pods: list[WorkerPod], nodes: dict[str, NodeHealth], why: str | None
) -> None:
    found = run(made, pods, nodes=nodes)
    assert found.status.attempt == 1
    assert found.status.replacements is None
    assert found.status.phase == Phase.RESTARTING
    if why is None:
        assert "not replaced alone" not in found.status.message
    else:
        assert why in found.status.message


def test_a_failure_policy_rule_decides_what_it_names() -> None:
    rule = {"action": "RestartGang", "onReasons": ["NodeNotReady"]}
    found = lose_node_1(body(failure_policy={"rules": [rule]}))
    assert found.status.attempt == 1
    assert "a failurePolicy rule matched" in found.status.message


def test_spent_disruptions_fail_the_job_as_before() -> None:
    found = lose_node_1(body(failure_policy={"maxDisruptions": 1}, status={"disruptions": 1}))
    assert (found.status.phase, found.status.reason) == (Phase.FAILED, "MaxDisruptionsExceeded")


def replacing(**changes: Any) -> dict[str, Any]:
    """A job whose worker 1 (old pod uid-1 on node-1) is being replaced since `since`;
    `serial` 0 (the default here) is an entry an earlier operator wrote."""
    pending = {"rank": 1, "podUID": "uid-1", "node": "node-1", "cause": "disruption",
               "what": "worker 1 lost its node", "since": changes.pop("since", ago(5)),
               "serial": changes.pop("serial", 0)}  # fmt: skip
    status = {
        "disruptions": 1,
        "replacements": {"total": 1, "attempt": 0, "inAttempt": 1, "pending": [pending]},
    }
    return body(status=status, phase="Restarting", **changes)


def stamp(made: dict[str, Any]) -> dict[str, Any]:
    pending = made["status"]["replacements"]["pending"][0]
    pending["since"] = pending["since"].isoformat()
    return made


def test_the_replacement_is_created_while_the_old_pod_still_terminates() -> None:
    made = stamp(replacing(serial=1))
    found = run(made, gang(r1={"deleting": True}), nodes={"node-1": NOT_READY})
    assert found.create_ranks == (1,)
    assert (found.status.attempt, found.status.disruptions) == (0, 1)  # not counted twice
    assert not [e for e in found.events if e.reason == Reason.REPLACING_WORKER]
    # Its pod, as the operator builds it from the decided status: a name of its own, the
    # worker's hostname (so its DNS name and PET_LOCAL_ADDR) unchanged.
    resolved = with_status(resolve_job(parse_trainingjob(made)), found.status)
    (pod,) = build_worker_pods(resolved, found.create_ranks, found.status.attempt)
    assert pod["metadata"]["name"] == "demo-a0-worker-1-r1"
    assert pod["metadata"]["labels"][contract.LABEL_REPLACEMENT] == "1"
    assert pod["spec"]["hostname"] == "demo-worker-1"
    observed = observe_pod(pod)
    assert observed is not None
    assert observed.serial == 1


def test_an_entry_without_a_serial_waits_for_the_old_pod_whose_name_it_reuses() -> None:
    # An entry an earlier operator wrote: its new pod takes the old one's name.
    made = stamp(replacing())
    found = run(made, gang(r1={"deleting": True}), nodes={"node-1": NOT_READY})
    assert found.create_ranks == ()
    assert (found.status.attempt, found.status.disruptions) == (0, 1)
    departed = replace(gang(r1={"deleting": True})[1], departed=True)
    found = run(made, [gang()[0], departed], nodes={"node-1": NOT_READY})
    assert found.create_ranks == (1,)
    resolved = with_status(resolve_job(parse_trainingjob(made)), found.status)
    (pod,) = build_worker_pods(resolved, found.create_ranks, found.status.attempt)
    assert pod["metadata"]["name"] == "demo-a0-worker-1"
    assert contract.LABEL_REPLACEMENT not in pod["metadata"]["labels"]


def test_serials_count_every_replacement_of_the_job_so_names_never_repeat() -> None:
    earlier = {"total": 4, "attempt": 0, "inAttempt": 0, "pending": []}
    found = run(body(status={"replacements": earlier}), gang(), nodes={"node-1": NOT_READY})
    assert found.status.replacements is not None
    assert [p.serial for p in found.status.replacements.pending] == [5]


def newer(rank: int, serial: int, **options: Any) -> WorkerPod:
    pod = make_pod(rank, **options)
    return replace(pod, name=f"{pod.name}-r{serial}", uid=f"uid-{rank}-r{serial}", serial=serial)


@pytest.mark.parametrize("departed", [False, True], ids=["terminating", "departed"])
def test_a_replaced_pod_still_around_after_its_replacement_runs_is_no_trouble(
    departed: bool,
) -> None:
    old = replace(gang(r1={"deleting": True})[1], departed=departed)
    done = {"total": 1, "attempt": 0, "inAttempt": 1, "pending": []}
    found = run(body(status={"replacements": done, "disruptions": 1}),
                [gang()[0], old, newer(1, 1)])  # fmt: skip
    assert (found.status.attempt, found.status.disruptions, found.status.restarts) == (0, 1, 0)
    assert found.status.phase == Phase.RUNNING
    assert (found.create_ranks, found.delete_pods, found.force_delete_pods) == ((), (), ())


def test_the_newest_replacement_lost_is_trouble_again() -> None:
    old = replace(gang(r1={"deleting": True})[1], departed=True)
    done = {"total": 1, "attempt": 0, "inAttempt": 1, "pending": []}
    found = run(body(status={"replacements": done, "disruptions": 1}),
                [gang()[0], old, newer(1, 1, deleting=True)])  # fmt: skip
    assert (found.status.attempt, found.status.disruptions) == (0, 2)
    assert found.status.replacements is not None
    (pending,) = found.status.replacements.pending
    assert (pending.rank, pending.pod_uid, pending.serial) == (1, "uid-1-r1", 2)


def test_a_running_replacement_ends_it_with_an_event_naming_both_nodes() -> None:
    new = replace(make_pod(1, placed_node="node-7"), uid="uid-new")
    found = run(stamp(replacing()), [gang()[0], new])
    assert found.status.replacements is not None
    assert found.status.replacements.pending == []
    assert (found.status.attempt, found.status.phase) == (0, Phase.RUNNING)
    (event,) = [e for e in found.events if e.reason == Reason.WORKER_REPLACED]
    assert event.type == "Warning"
    assert "worker 1 replaced: node node-1 -> node-7" in event.message
    condition = found.status.condition(ConditionType.WORKER_REPLACEMENT)
    assert condition is not None
    assert (condition.status, condition.reason) == ("False", Reason.WORKER_REPLACED)


def test_a_replacement_not_running_in_time_recreates_the_gang() -> None:
    waiting = replace(make_pod(1, gated=True, bound=False, phase="Pending"), uid="uid-new")
    made = stamp(replacing(since=ago(301), replacement={"timeoutSeconds": 300}))
    found = run(made, [gang()[0], waiting])
    assert found.status.attempt == 1
    assert "worker 1's replacement not running 300s after it was decided" in found.status.message
    assert set(found.delete_pods) == {"demo-a0-worker-0", "demo-a0-worker-1"}
    condition = found.status.condition(ConditionType.WORKER_REPLACEMENT)
    assert condition is not None
    assert condition.reason == Reason.REPLACEMENT_TIMED_OUT


def test_a_replacement_still_in_time_wakes_the_job_when_it_runs_out() -> None:
    waiting = replace(make_pod(1, gated=True, bound=False, phase="Pending"), uid="uid-new")
    found = run(stamp(replacing(since=ago(100))), [gang()[0], waiting])
    assert found.status.attempt == 0
    assert found.requeue_after is not None
    assert found.requeue_after <= 200


def test_a_failing_replacement_is_judged_like_any_worker() -> None:
    failed = replace(make_pod(1, phase="Failed", exit_code=1), uid="uid-new")
    found = run(stamp(replacing()), [gang()[0], failed])
    assert (found.status.attempt, found.status.restarts) == (1, 1)


def test_the_bound_counts_replacements_and_in_place_restarts_of_the_attempt() -> None:
    job = parse_trainingjob(body(status={
        "replacements": {"total": 5, "attempt": 0, "inAttempt": 1},
        "goodput": {"counted": {"attempt": 0, "inPlaceRestarts": 2}},
    }))  # fmt: skip
    incident = Incident(1, "demo-a0-worker-1", "lost", disruption="NodeLost")
    verdict = judge_replacement(job, job.status, [incident])
    assert verdict.ranks == ()
    assert "used 3 of spec.runtime.inPlaceRestarts (3)" in verdict.why_not
    older = job.status.model_copy(update={"attempt": 1})  # an earlier attempt's count is moot
    assert judge_replacement(job, older, [incident]).ranks == (1,)


@pytest.mark.parametrize(
    ("nodes", "expected"),
    [
        (["n1", "n2"], [{"rack": "r1"}, {"spine": "s1"}]),
        (["n1", "n3"], [{"spine": "s1"}]),
        (["n1", "n4"], []),
        (["n1", "unknown"], []),
    ],
    ids=["same-rack", "same-spine", "apart", "unknown-node"],
)
def test_gang_domains_narrowest_first(nodes: list[str], expected: list[dict[str, str]]) -> None:
    labels = {
        "n1": {"spine": "s1", "rack": "r1"},
        "n2": {"spine": "s1", "rack": "r1"},
        "n3": {"spine": "s1", "rack": "r2"},
        "n4": {"spine": "s2", "rack": "r3"},
    }
    assert gang_domains(("spine", "rack", "host"), labels, nodes) == expected


def test_a_worker_already_gone_from_the_api_is_replaced_with_its_last_known_node() -> None:
    evicted = {"conditions": ({"type": "DisruptionTarget", "status": "True",
                               "reason": "EvictionByEvictionAPI"},), "deleting": True}  # fmt: skip
    departed = replace(gang(r1=evicted)[1], departed=True)
    found = run(body(), [gang()[0], departed])
    assert found.status.replacements is not None
    (pending,) = found.status.replacements.pending
    assert (pending.pod_uid, pending.node) == ("uid-1", "node-1")
    assert (found.delete_pods, found.force_delete_pods) == ((), ())
    # Next reconcile, the replacement recorded: its name is free, so worker 1 is created.
    job = parse_trainingjob(body())
    again = decide(
        resolve_job(job.model_copy(update={"status": found.status})),
        [gang()[0], departed],
        NOW,
    )
    assert again.create_ranks == (1,)
    assert again.status.disruptions == 1


def test_the_old_pod_still_shown_running_does_not_count_as_the_gang_running() -> None:
    found = run(stamp(replacing()), gang(), nodes={"node-1": NOT_READY})
    assert found.status.phase == Phase.RESTARTING
    assert (found.status.ready_workers, found.create_ranks) == (1, ())


def test_a_replaced_straggler_moves_alone_and_its_node_is_marked() -> None:
    from test_straggler_replace import report

    made = body()
    made["spec"]["runPolicy"]["stragglers"] = {"reports": 2, "replace": True}
    job = parse_trainingjob(made)
    pods = gang()
    memory, found = None, None
    for step in (10, 11):
        reports = {0: report(0, step, 0.1), 1: report(1, step, 0.2)}
        found = decide(resolve_job(job), pods, NOW, reports=reports, memory=memory)
        memory = found.memory
        job = job.model_copy(update={"status": found.status})
    assert found is not None
    assert [node for node, _ in found.mark_nodes] == ["node-1"]
    assert (found.status.attempt, found.status.disruptions) == (0, 1)
    assert found.delete_pods == ("demo-a0-worker-1",)  # a healthy node: a graceful delete
    assert found.status.replacements is not None
    assert found.status.replacements.pending[0].cause == "straggler"


@pytest.mark.parametrize(
    ("grace", "asked"),
    [(30, ago(30)), (0, None), (None, None)],
    ids=["graceful", "kubelet-final-delete", "no-grace-field"],
)  # fmt: skip
def test_when_a_deletion_was_asked_for_is_read_only_from_a_graceful_delete(
    grace: int | None, asked: Any
) -> None:
    made = make_pod_body(1, deleting=True)
    if grace is None:
        del made["metadata"]["deletionGracePeriodSeconds"]
    else:
        made["metadata"]["deletionGracePeriodSeconds"] = grace
    pod = observe_pod(made)
    assert pod is not None
    assert pod.delete_asked_at == asked
