"""The disruption-aware failure policy: incidents, rules by exit code, condition and reason,
restart budgets by cause, and the backoff of Ignore restarts."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from factories import NOW, ago, make_job, make_pod, pod_name, rule

from trainwave.api.trainingjob import InvalidSpec
from trainwave.lifecycle.decide import decide
from trainwave.lifecycle.observed import NodeHealth, WorkerPod
from trainwave.lifecycle.restarts import ignore_backoff
from trainwave.resolving import resolve_job

pytestmark = pytest.mark.timeout(10)

RUNNING: dict[str, Any] = {"phase": "Running", "start_time": ago(100)}


def evicted_by(reason: str, status: str = "True") -> tuple[dict[str, str], ...]:
    return ({"type": "DisruptionTarget", "status": status, "reason": reason},)


def oom(rank: int = 1) -> WorkerPod:
    return make_pod(rank, phase="Failed", ready=False, exit_code=137, container_reason="OOMKilled",
                    finished_at=ago(5))  # fmt: skip


def disrupted(rank: int = 1, reason: str = "EvictionByEvictionAPI", **options: Any) -> WorkerPod:
    """Marked DisruptionTarget and, unless told otherwise, already being deleted."""
    return make_pod(rank, conditions=evicted_by(reason), **{"deleting": True, **options})


def on_reasons(action: str, *reasons: str) -> dict[str, Any]:
    return {"action": action, "onReasons": list(reasons)}


def on_conditions(action: str, kind: str, *reasons: str) -> dict[str, Any]:
    return {"action": action, "onPodConditions": [{"type": kind, "reasons": list(reasons)}]}


GONE = {"node-1": NodeHealth(present=False)}


def not_ready_for(seconds: float) -> dict[str, NodeHealth]:
    return {"node-1": NodeHealth(present=True, ready=False, not_ready_since=ago(seconds))}


# (job kwargs, pods, nodes, expected). Expected keys: phase, reason, restarts, disruptions,
# ignored, attempt, delete, requeue, message (a fragment).
CASES = [
    pytest.param({}, [make_pod(0), oom()], {},
                 {"phase": "Restarting", "reason": "WorkerFailed", "restarts": 1, "ignored": 0,
                  "message": "exited with code 137 (OOMKilled)"},
                 id="oom-is-a-counted-failure"),
    pytest.param({"rules": (rule("Ignore", "In", 137),)}, [make_pod(0), oom()], {},
                 {"phase": "Restarting", "reason": "FailureIgnored", "restarts": 0, "ignored": 1,
                  "requeue": 10.0, "message": "(ignored restart 1 of 10) in 10s"},
                 id="old-ignore-137-recipe-is-capped-and-backs-off"),
    pytest.param({"rules": (rule("Ignore", "In", 137),), "status_extra": {"ignoredRestarts": 10}},
                 [make_pod(0), oom()], {},
                 {"phase": "Failed", "reason": "MaxIgnoredRestartsExceeded", "ignored": 10,
                  "message": "after 10 ignored restart(s); maxIgnoredRestarts is 10"},
                 id="ignore-cap-fails-the-job"),
    pytest.param({"rules": (on_reasons("FailJob", "OOMKilled"), rule("Ignore", "In", 137))},
                 [make_pod(0), oom()], {},
                 {"phase": "Failed", "reason": "FailedByRule",
                  "message": "(failurePolicy.rules[0]: FailJob)"},
                 id="on-reasons-tells-oom-from-sigkill"),
    pytest.param({"rules": (on_reasons("FailJob", "OOMKilled"), rule("Ignore", "In", 137))},
                 [make_pod(0), make_pod(1, phase="Failed", exit_code=137, finished_at=ago(5))], {},
                 {"phase": "Restarting", "reason": "FailureIgnored", "ignored": 1},
                 id="plain-sigkill-still-ignored"),
    pytest.param({}, [make_pod(0), disrupted()], {},
                 {"phase": "Restarting", "reason": "WorkerDisrupted", "restarts": 0,
                  "disruptions": 1, "attempt": 1, "delete": [pod_name(0)],
                  "message": "was disrupted (DisruptionTarget: EvictionByEvictionAPI); "
                             "restarting the gang (disruption 1 of 20)"},
                 id="eviction-is-a-disruption-not-a-restart"),
    pytest.param({}, [make_pod(0), disrupted(deleting=False, reason="PreemptionByScheduler")], {},
                 {"phase": "Restarting", "disruptions": 1,
                  "delete": [pod_name(0), pod_name(1)]},
                 id="marked-pod-acted-on-before-it-is-deleted"),
    pytest.param({"status_extra": {"disruptions": 20}}, [make_pod(0), disrupted()], {},
                 {"phase": "Failed", "reason": "MaxDisruptionsExceeded", "restarts": 0,
                  "message": "after 20 disruption(s); maxDisruptions is 20"},
                 id="disruption-budget-spent"),
    pytest.param({"failure_policy": {"maxDisruptions": 0}}, [make_pod(0), disrupted()], {},
                 {"phase": "Failed", "reason": "MaxDisruptionsExceeded"},
                 id="max-disruptions-zero"),
    pytest.param({"rules": (on_conditions("RestartGang", "DisruptionTarget",
                                          "PreemptionByScheduler"),)},
                 [make_pod(0), disrupted(reason="PreemptionByScheduler")], {},
                 {"phase": "Restarting", "restarts": 1, "disruptions": 0},
                 id="condition-rule-with-matching-reason"),
    pytest.param({"rules": (on_conditions("FailJob", "DisruptionTarget",
                                          "PreemptionByScheduler"),)},
                 [make_pod(0), disrupted(reason="EvictionByEvictionAPI")], {},
                 {"phase": "Restarting", "disruptions": 1},
                 id="condition-rule-other-reason-falls-to-default"),
    pytest.param({"rules": (on_conditions("FailJob", "DisruptionTarget"),)},
                 [make_pod(0), disrupted(reason="DeletionByTaintManager")], {},
                 {"phase": "Failed", "reason": "FailedByRule"},
                 id="condition-rule-any-reason"),
    pytest.param({}, [make_pod(0), make_pod(1, conditions=evicted_by("X", status="False"))], {},
                 {"phase": "Running", "disruptions": 0},
                 id="stale-false-condition-is-no-disruption"),
    pytest.param({}, [make_pod(0), make_pod(1, phase="Failed", pod_reason="Evicted",
                                            conditions=evicted_by("TerminationByKubelet"))], {},
                 {"phase": "Restarting", "disruptions": 1,
                  "message": "failed (Evicted)"},
                 id="kubelet-eviction-is-a-disruption"),
    pytest.param({}, [make_pod(0), make_pod(1, phase="Failed", pod_reason="OutOfnvidia.com/gpu")],
                 {}, {"phase": "Restarting", "disruptions": 1},
                 id="kubelet-admission-refusal-is-a-disruption"),
    pytest.param({}, [make_pod(0), make_pod(1, phase="Failed", exit_code=1, finished_at=ago(5),
                                            pod_reason="Terminated")], {},
                 {"phase": "Restarting", "disruptions": 1}, id="node-shutdown-is-a-disruption"),
    pytest.param({}, [make_pod(0), make_pod(1)], GONE,
                 {"phase": "Restarting", "disruptions": 1, "restarts": 0,
                  "delete": [pod_name(0), pod_name(1)],
                  "message": "worker 1 (demo-a0-worker-1) lost its node node-1 (NodeLost)"},
                 id="node-deleted-is-a-disruption"),
    pytest.param({"rules": (on_reasons("FailJob", "NodeLost"),)}, [make_pod(0), make_pod(1)],
                 GONE, {"phase": "Failed", "reason": "FailedByRule"},
                 id="on-reasons-node-lost"),
    pytest.param({}, [make_pod(0), make_pod(1)], not_ready_for(20),
                 {"phase": "Running", "disruptions": 0, "requeue": 40.0, "delete": []},
                 id="not-ready-within-grace-waits"),
    pytest.param({}, [make_pod(0), make_pod(1)], not_ready_for(61),
                 {"phase": "Restarting", "disruptions": 1,
                  "message": "lost its node node-1 (NodeNotReady)"},
                 id="not-ready-past-grace-is-a-disruption"),
    pytest.param({"failure_policy": {"nodeNotReadySeconds": 0}}, [make_pod(0), make_pod(1)],
                 {"node-1": NodeHealth(present=True, ready=False)},
                 {"phase": "Restarting", "disruptions": 1}, id="grace-zero-acts-at-once"),
    pytest.param({}, [make_pod(0), make_pod(1)],
                 {"node-1": NodeHealth(present=True, ready=True)},
                 {"phase": "Running", "requeue": None}, id="ready-node-is-fine"),
    pytest.param({}, [make_pod(0), make_pod(1, phase="Succeeded", exit_code=0)], GONE,
                 {"phase": "Running", "disruptions": 0}, id="finished-worker-needs-no-node"),
    pytest.param({}, [make_pod(0), make_pod(1, deleting=True)], {},
                 {"phase": "Restarting", "restarts": 1, "disruptions": 0,
                  "message": "was deleted before it finished"},
                 id="deleted-without-evidence-is-counted"),
    pytest.param({"phase": "Pending"}, [make_pod(0, phase="Pending", ready=False),
                                        disrupted(phase="Pending", ready=False)], {},
                 {"phase": "Pending", "disruptions": 0},
                 id="before-the-gang-formed-a-taken-pod-is-recreated"),
    pytest.param({}, [oom(0), disrupted(1)], {},
                 {"phase": "Restarting", "restarts": 1, "disruptions": 0},
                 id="the-earlier-incident-decides"),
]  # fmt: skip


@pytest.mark.parametrize(("options", "pods", "nodes", "expected"), CASES)
def test_failure_policy(
    options: dict[str, Any],
    pods: list[WorkerPod],
    nodes: dict[str, NodeHealth],
    expected: dict[str, Any],
) -> None:
    decision = decide(resolve_job(make_job(**{**RUNNING, **options})), pods, NOW, nodes=nodes)
    status = decision.status
    actual = {
        "phase": status.phase,
        "reason": status.reason,
        "restarts": status.restarts,
        "disruptions": status.disruptions,
        "ignored": status.ignored_restarts,
        "attempt": status.attempt,
        "delete": list(decision.delete_pods),
        "requeue": decision.requeue_after,
    }
    fragment = expected.pop("message", None)
    assert {k: actual[k] for k in expected} == expected
    if fragment is not None:
        assert fragment in status.message, status.message


def test_ignore_backoff_holds_the_next_gang_until_its_time() -> None:
    after_ignore = decide(resolve_job(make_job(**RUNNING, rules=(rule("Ignore", "In", 137),))),
                          [make_pod(0), oom()], NOW).status  # fmt: skip
    assert after_ignore.next_attempt_time == NOW + timedelta(seconds=10)
    job = make_job(phase="Restarting", attempt=1, start_time=ago(100),
                   status_extra={"nextAttemptTime": (NOW + timedelta(seconds=4)).isoformat()})  # fmt: skip
    waiting = decide(resolve_job(job), [], NOW)
    assert (waiting.create_ranks, waiting.requeue_after) == ((), 4.0)
    assert waiting.status.next_attempt_time is not None
    later = decide(resolve_job(job), [], NOW + timedelta(seconds=4))
    assert later.create_ranks == (0, 1)
    assert later.status.next_attempt_time is None


@pytest.mark.parametrize(
    ("first", "nth", "seconds"),
    [(10, 1, 10), (10, 2, 20), (10, 5, 160), (10, 6, 300), (10, 60, 300), (1, 3, 4)],
)
def test_ignore_backoff_doubles_up_to_five_minutes(first: int, nth: int, seconds: int) -> None:
    assert ignore_backoff(first, nth) == seconds


def test_backoff_zero_restarts_at_once() -> None:
    job = make_job(**RUNNING, rules=(rule("Ignore", "In", 137),),
                   failure_policy={"ignoreBackoffSeconds": 0})  # fmt: skip
    decision = decide(resolve_job(job), [make_pod(0), oom()], NOW)
    assert (decision.status.next_attempt_time, decision.requeue_after) == (None, None)


TWO_MATCHERS = {"action": "FailJob", "onReasons": ["OOMKilled"],
                "onExitCodes": {"operator": "In", "values": [1]}}  # fmt: skip


@pytest.mark.parametrize(
    ("rule_body", "named"),
    [
        pytest.param({"action": "FailJob"}, "got none", id="no-matcher"),
        pytest.param(TWO_MATCHERS, "got onExitCodes, onReasons", id="two-matchers"),
    ],
)
def test_a_rule_needs_exactly_one_matcher(rule_body: dict[str, Any], named: str) -> None:
    with pytest.raises(InvalidSpec) as error:
        make_job(rules=(rule_body,))
    message = str(error.value)
    assert "spec.runPolicy.failurePolicy.rules[0]" in message
    assert "exactly one of onExitCodes, onPodConditions, onReasons" in message
    assert named in message


def test_a_reason_must_be_a_word() -> None:
    with pytest.raises(InvalidSpec, match=r"onReasons\[0\]"):
        make_job(rules=(on_reasons("FailJob", "out of memory"),))
