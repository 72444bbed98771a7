"""Kueue admission of queued jobs: decide with an observed Workload, the flavor merge,
the Workload manifest and the conditions trainwave writes back to Kueue."""

from __future__ import annotations

from typing import Any

import pytest
from factories import NOW, ago, make_job, make_pod, running

from trainwave.api.status import ConditionType
from trainwave.builders.workload import build_workload, workload_name
from trainwave.lifecycle.admission import (
    Admission,
    Flavor,
    Workload,
    finished_conditions,
    observe_workload,
    released_conditions,
    with_flavors,
)
from trainwave.lifecycle.decide import decide
from trainwave.lifecycle.workload_actions import WorkloadAction
from trainwave.resolving import resolve_job

pytestmark = pytest.mark.timeout(10)

QUEUE = "team-a"


def cond(kind: str, status: str = "True", reason: str = "", message: str = "") -> dict[str, Any]:
    return {"type": kind, "status": status, "reason": reason or kind, "message": message}


PENDING = (cond("QuotaReserved", "False", "Pending", "insufficient unused quota"),)
ADMITTED = (cond("QuotaReserved"), cond("Admitted"))
PREEMPTED = (*ADMITTED, cond("Evicted", reason="Preempted", message="Preempted to admit x"))
STOPPED = (*ADMITTED, cond("Evicted", reason="ClusterQueueStopped", message="stopped"))


def workload(
    conditions: tuple[dict[str, Any], ...] = (), flavors: tuple[str, ...] = (), active: bool = True
) -> Workload:
    return Workload(
        name="trainingjob-demo-abcde", owner_uid="uid-1", resource_version="7", queue=QUEUE,
        conditions=conditions, cluster_queue="gpus", flavors=flavors, active=active,
    )  # fmt: skip


def admission(*conditions: dict[str, Any]) -> Admission:
    return Admission(QUEUE, workload(tuple(conditions)))


CASES = [
    pytest.param(
        {},
        [],
        Admission(QUEUE, None),
        {"phase": "Pending", "reason": "Queued", "workload": "Create", "create": ()},
        id="no-workload-yet",
    ),
    pytest.param(
        {"phase": "Pending"},
        [],
        admission(*PENDING),
        {"phase": "Pending", "reason": "Queued", "workload": "", "create": ()},
        id="pending-quota",
    ),
    pytest.param(
        {"phase": "Pending"},
        [],
        admission(*ADMITTED),
        {"phase": "Pending", "reason": "CreatingWorkers", "workload": "", "create": (0, 1)},
        id="admitted-starts-gang",
    ),
    pytest.param(
        {
            "phase": "Running",
            "start_time": ago(60),
            "status_extra": {"attemptStartTime": "2026-01-01T11:59:00Z"},
        },
        running(),
        admission(*PREEMPTED),
        {
            "phase": "Pending",
            "reason": "Preempted",
            "workload": "",
            "attempt": 1,
            "preemptions": 1,
            "restarts": 0,
            "delete": 2,
        },
        id="preempted-stops-first",
    ),
    pytest.param(
        {"phase": "Pending", "attempt": 1},
        [],
        admission(*PREEMPTED),
        {"phase": "Pending", "workload": "Release", "attempt": 1, "preemptions": 0},
        id="preempted-gang-gone-releases-once",
    ),
    pytest.param(
        {"phase": "Running", "start_time": ago(60)},
        running(),
        admission(*STOPPED),
        {
            "phase": "Pending",
            "reason": "Evicted",
            "attempt": 1,
            "preemptions": 0,
            "restarts": 0,
            "disruptions": 0,
            "delete": 2,
        },
        id="evicted-uncounted",
    ),
    pytest.param(
        {"phase": "Running", "start_time": ago(60)},
        running(),
        admission(*PENDING),
        {"phase": "Pending", "attempt": 1, "restarts": 0, "delete": 2},
        id="admission-withdrawn",
    ),
    pytest.param(
        {"phase": "Succeeded", "completion_time": ago(1)},
        [],
        admission(*ADMITTED),
        {"phase": "Succeeded", "workload": "Finish"},
        id="finished-releases",
    ),
    pytest.param(
        {"phase": "Succeeded", "completion_time": ago(1)},
        [],
        admission(*ADMITTED, cond("Finished")),
        {"phase": "Succeeded", "workload": ""},
        id="finished-once",
    ),
]


@pytest.mark.parametrize(("job_kwargs", "pods", "queued", "expected"), CASES)
def test_decide_with_a_workload(job_kwargs, pods, queued, expected) -> None:
    decision = decide(resolve_job(make_job(**job_kwargs)), pods, NOW, admission=queued)
    status = decision.status
    for key in ("phase", "reason"):
        if key in expected:
            assert getattr(status, key) == expected[key]
    for key in ("attempt", "preemptions", "restarts", "disruptions"):
        if key in expected:
            assert getattr(status, key) == expected[key], key
    if "workload" in expected:
        assert decision.workload == WorkloadAction(expected["workload"])
    if "create" in expected:
        assert decision.create_ranks == expected["create"]
    if "delete" in expected:
        assert len(decision.delete_pods) == expected["delete"]


def test_a_queued_job_says_which_queue_and_why() -> None:
    decision = decide(resolve_job(make_job()), [], NOW, admission=admission(*PENDING))
    assert decision.status.message == (
        "waiting for Kueue admission in LocalQueue team-a: insufficient unused quota"
    )
    admitted = decision.status.condition(ConditionType.ADMITTED)
    assert admitted is not None
    assert admitted.status == "False"


DEACTIVATED = (*ADMITTED, cond("Evicted", reason="InactiveWorkload", message="deactivated"))


def test_a_suspended_job_deactivates_its_workload_then_gives_the_quota_back() -> None:
    job = make_job(suspend=True, phase="Running", start_time=ago(9))
    first = decide(resolve_job(job), running(), NOW, admission=admission(*ADMITTED))
    assert (first.status.phase, first.workload) == ("Suspended", WorkloadAction.DEACTIVATE)
    inactive = Admission(QUEUE, workload(DEACTIVATED, active=False))
    assert (
        decide(resolve_job(job), running(), NOW, admission=inactive).workload == WorkloadAction.NONE
    )
    assert decide(resolve_job(job), [], NOW, admission=inactive).workload == WorkloadAction.RELEASE
    resumed = make_job(phase="Suspended")
    released = Admission(QUEUE, workload(PENDING, active=False))
    again = decide(resolve_job(resumed), [], NOW, admission=released)
    assert (again.status.phase, again.workload) == ("Pending", WorkloadAction.ACTIVATE)
    assert again.create_ranks == ()


def test_queued_and_admitted_post_one_event_each() -> None:
    queued = decide(resolve_job(make_job()), [], NOW, admission=admission(*PENDING))
    assert [e.reason for e in queued.events] == ["Created", "Queued"]
    job = make_job().model_copy(update={"status": queued.status})
    assert decide(resolve_job(job), [], NOW, admission=admission(*PENDING)).events == ()
    admitted = decide(resolve_job(job), [], NOW, admission=admission(*ADMITTED))
    assert [e.reason for e in admitted.events] == ["Admitted"]


def pending(message: str) -> Admission:
    return admission(cond("QuotaReserved", "False", "Pending", message))


QUOTA_8 = ("couldn't assign flavors to pod set worker: insufficient unused quota for "
           "nvidia.com/gpu in flavor h100, 8 more needed")  # fmt: skip


def test_kueues_reason_is_an_event_when_it_changes_not_on_every_resync() -> None:
    """`kubectl describe` readers look at Events: Kueue's words on why the job waits are
    posted when they first come and when their gist changes; the counts moving ("8 more
    needed" -> "4 more needed") as other jobs come and go are the same reason."""
    created = decide(resolve_job(make_job()), [], NOW, admission=Admission(QUEUE, None))
    assert [(e.reason, e.message) for e in created.events] == [
        ("Created", "job accepted"),
        ("Queued", "waiting for Kueue admission in LocalQueue team-a: creating its Workload"),
    ]
    job = make_job().model_copy(update={"status": created.status})
    # The Workload exists; Kueue has not said anything yet: no news.
    quiet = decide(resolve_job(job), [], NOW, admission=admission())
    assert quiet.events == ()
    job = job.model_copy(update={"status": quiet.status})
    said = decide(resolve_job(job), [], NOW, admission=pending(QUOTA_8))
    expected = f"waiting for Kueue admission in LocalQueue team-a: {QUOTA_8}"
    assert [(e.type, e.reason, e.message) for e in said.events] == [
        ("Normal", "KueuePending", expected)
    ]
    job = job.model_copy(update={"status": said.status})
    assert decide(resolve_job(job), [], NOW, admission=pending(QUOTA_8)).events == (), "a resync"
    fewer = decide(
        resolve_job(job), [], NOW, admission=pending(QUOTA_8.replace("8 more", "4 more"))
    )
    assert fewer.events == (), "the same reason with other numbers"
    assert fewer.status.message.endswith("4 more needed"), "the status keeps the latest words"
    job = job.model_copy(update={"status": fewer.status})
    other = "ClusterQueue gpus is inactive"
    changed = decide(resolve_job(job), [], NOW, admission=pending(other))
    assert [(e.reason, e.message) for e in changed.events] == [
        ("KueuePending", f"waiting for Kueue admission in LocalQueue team-a: {other}")
    ]


def test_an_eviction_moves_the_attempt_once() -> None:
    first = decide(resolve_job(make_job(phase="Running", start_time=ago(9))), running(), NOW,
                   admission=admission(*PREEMPTED))  # fmt: skip
    job = make_job(phase="Running").model_copy(update={"status": first.status})
    # The old pods are going away; the Workload still shows the eviction.
    leaving = [make_pod(r, 0, deleting=True) for r in (0, 1)]
    again = decide(resolve_job(job), leaving, NOW, admission=admission(*PREEMPTED))
    assert (again.status.attempt, again.status.preemptions) == (1, 1)
    assert again.workload == WorkloadAction.NONE  # pods not gone yet: quota kept
    gone = decide(resolve_job(job), [], NOW, admission=admission(*PREEMPTED))
    assert (gone.status.attempt, gone.workload) == (1, WorkloadAction.RELEASE)


def test_jobs_without_admission_run_as_before() -> None:
    assert decide(resolve_job(make_job()), [], NOW).create_ranks == (0, 1)


def test_flavors_add_node_labels_and_tolerations() -> None:
    toleration = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    job = make_job(template={"spec": {"nodeSelector": {"zone": "a", "pool": "mine"}}})
    merged = with_flavors(job, [Flavor("h100", {"pool": "h100", "gpu": "h100"}, (toleration,))])
    spec = merged.spec.template.spec
    assert spec["nodeSelector"] == {"zone": "a", "pool": "h100", "gpu": "h100"}
    assert spec["tolerations"] == [toleration]
    assert resolve_job(merged).gang.node_selector["gpu"] == "h100"
    assert job.spec.template.spec["nodeSelector"]["pool"] == "mine"  # the original is untouched


def test_the_workload_counts_what_the_workers_hold() -> None:
    job = make_job(workers=3, gpus_per_worker=8, placement={"priority": 5})
    body = build_workload(resolve_job(job), QUEUE)
    assert body["metadata"]["name"] == workload_name("demo", "uid-1")
    assert body["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    spec = body["spec"]
    assert (spec["queueName"], spec["priority"]) == (QUEUE, 5)
    [pod_set] = spec["podSets"]
    assert (pod_set["name"], pod_set["count"]) == ("workers", 3)
    worker = pod_set["template"]["spec"]["containers"][0]
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == 8


def test_shared_gpu_workloads_count_gpu_memory() -> None:
    job = make_job(workers=1, gpus_per_worker=0, gpuSharing={"memory": "20Gi"})
    body = build_workload(resolve_job(job), QUEUE)
    worker = body["spec"]["podSets"][0]["template"]["spec"]["containers"][0]
    assert worker["resources"]["limits"]["trainwave.io/gpu-memory"] == 20 * 1024


def test_observed_workload_and_conditions_written_back() -> None:
    raw = {
        "metadata": {"name": "w", "resourceVersion": "3", "ownerReferences": [
            {"apiVersion": "trainwave.io/v1alpha1", "kind": "TrainingJob", "uid": "uid-1"}]},
        "spec": {"queueName": QUEUE},
        "status": {"conditions": list(PREEMPTED), "admission": {
            "clusterQueue": "gpus",
            "podSetAssignments": [{"name": "workers", "flavors": {"nvidia.com/gpu": "h100"}}]}},
    }  # fmt: skip
    seen = observe_workload(raw)
    assert seen is not None
    assert seen.evicted
    assert not seen.admitted
    assert seen.flavors == ("h100",)
    released = {c["type"]: c for c in released_conditions(seen, NOW)}
    assert (released["QuotaReserved"]["status"], released["QuotaReserved"]["reason"]) == (
        "False", "Pending")  # fmt: skip
    assert released["Admitted"]["reason"] == "NoReservation"
    assert released["Requeued"]["status"] == "True"
    stopped = released_conditions(workload(STOPPED), NOW)
    requeued = next(c for c in stopped if c["type"] == "Requeued")
    assert (requeued["status"], requeued["reason"]) == ("False", "ClusterQueueStopped")
    assert released["Evicted"]["status"] == "True"  # Kueue's own, left as it was
    finished = {c["type"]: c for c in finished_conditions(seen, True, "done", NOW)}
    assert (finished["Finished"]["status"], finished["Finished"]["reason"]) == ("True", "Succeeded")
    assert observe_workload({"metadata": {"name": "x"}}) is None
