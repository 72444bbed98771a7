"""Factories for the pure core's inputs: TrainingJobs and observed worker pods.

Both go through the real boundary (`parse_trainingjob`, `observe_pod`) from raw
bodies, so every test also exercises the parsing the controller relies on.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from trainwave import contract
from trainwave.api.trainingjob import TrainingJob, parse_trainingjob
from trainwave.builders.names import worker_pod_name
from trainwave.lifecycle.observed import WorkerPod, observe_pod

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
NAMESPACE = "team-a"


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


def rule(action: str, operator: str, *codes: int) -> dict[str, Any]:
    """One failurePolicy rule, as a user writes it."""
    return {"action": action, "onExitCodes": {"operator": operator, "values": list(codes)}}


def _time(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat().replace("+00:00", "Z")


def make_body(
    name: str = "demo",
    *,
    workers: int = 2,
    gpus_per_worker: int = 0,
    processes_per_worker: int = 1,
    phase: str | None = None,
    attempt: int = 0,
    restarts: int = 0,
    suspend: bool = False,
    max_restarts: int = 3,
    rules: tuple[dict[str, Any], ...] = (),
    success_policy: str = "AllWorkers",
    active_deadline_seconds: int | None = None,
    ttl: int | None = None,
    start_time: datetime | None = None,
    completion_time: datetime | None = None,
    template: dict[str, Any] | None = None,
    env: tuple[tuple[str, str], ...] = (),
    uid: str = "uid-1",
    generation: int = 1,
    failure_policy: dict[str, Any] | None = None,
    status_extra: dict[str, Any] | None = None,
    **spec_overrides: Any,
) -> dict[str, Any]:
    """A raw TrainingJob body, camelCase, the way the API server sends it."""
    run_policy: dict[str, Any] = {
        "failurePolicy": {
            "maxRestarts": max_restarts,
            "rules": list(rules),
            **(failure_policy or {}),
        },
        "successPolicy": success_policy,
        "suspend": suspend,
    }
    if active_deadline_seconds is not None:
        run_policy["activeDeadlineSeconds"] = active_deadline_seconds
    if ttl is not None:
        run_policy["ttlSecondsAfterFinished"] = ttl
    spec: dict[str, Any] = {
        "workers": workers,
        "processesPerWorker": processes_per_worker,
        "gpusPerWorker": gpus_per_worker,
        "image": "example/train:1.0",
        "env": [{"name": n, "value": v} for n, v in env],
        "runPolicy": run_policy,
        **spec_overrides,
    }
    if template is not None:
        spec["template"] = template
    status: dict[str, Any] = {"attempt": attempt, "restarts": restarts, **(status_extra or {})}
    if phase is not None:
        status["phase"] = phase
    for key, value in (("startTime", start_time), ("completionTime", completion_time)):
        if value is not None:
            status[key] = _time(value)
    return {
        "apiVersion": contract.API_VERSION,
        "kind": contract.KIND,
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "uid": uid,
            "generation": generation,
            "resourceVersion": "100",
        },
        "spec": spec,
        "status": status,
    }


def make_job(name: str = "demo", **options: Any) -> TrainingJob:
    """A parsed TrainingJob: `make_body` through the operator's own parser."""
    return parse_trainingjob(make_body(name, **options))


def make_pod_body(
    rank: int,
    attempt: int = 0,
    phase: str = "Running",
    *,
    ready: bool = True,
    bound: bool = True,
    exit_code: int | None = None,
    deleting: bool = False,
    owner_uid: str = "uid-1",
    finished_at: datetime | None = None,
    job: str = "demo",
    gated: bool = False,
    placed_node: str | None = None,
    released_at: datetime | None = None,
    container_reason: str | None = None,
    pod_reason: str | None = None,
    conditions: tuple[dict[str, str], ...] = (),
    pod_ip: str | None = None,
    max_run_seconds: int | None = None,
) -> dict[str, Any]:
    """A raw worker Pod as the watch delivers it. `conditions` come after Ready."""
    metadata: dict[str, Any] = {
        "name": worker_pod_name(job, rank, attempt),
        "namespace": NAMESPACE,
        "labels": {
            contract.LABEL_JOB_NAME: job,
            contract.LABEL_ROLE: contract.ROLE_WORKER,
            contract.LABEL_RANK: str(rank),
            contract.LABEL_ATTEMPT: str(attempt),
        },
        "ownerReferences": [
            {"apiVersion": contract.API_VERSION, "kind": contract.KIND, "name": job,
             "uid": owner_uid, "controller": True},
        ],
    }  # fmt: skip
    if deleting:  # asked for 30 s ago, with the default grace period
        metadata["deletionTimestamp"] = _time(NOW)
        metadata["deletionGracePeriodSeconds"] = 30
    terminated: dict[str, Any] = {}
    if exit_code is not None:
        reason = container_reason or ("Error" if exit_code else "Completed")
        terminated = {"exitCode": exit_code, "reason": reason}
    if finished_at is not None:
        terminated["finishedAt"] = _time(finished_at)
    state = {"terminated": terminated} if terminated else {"running": {}}
    status: dict[str, Any] = {
        "phase": phase,
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}, *conditions],
        "containerStatuses": [{"name": contract.WORKER_CONTAINER, "state": state}],
    }
    if pod_ip is not None:
        status["podIP"] = pod_ip
    if pod_reason is not None:
        status["reason"] = pod_reason
    elif phase == "Failed" and exit_code is None:
        status["reason"] = "Evicted"
    spec: dict[str, Any] = {"nodeName": placed_node or f"node-{rank}"} if bound else {}
    if gated:
        spec["schedulingGates"] = [{"name": contract.SCHEDULING_GATE}]
    annotations = metadata.setdefault("annotations", {})
    if placed_node is not None:
        annotations[contract.ANNOTATION_PLACED_NODE] = placed_node
        annotations[contract.ANNOTATION_PLACEMENT_SUMMARY] = "placed by the test"
    if released_at is not None:
        annotations[contract.ANNOTATION_RELEASED_AT] = _time(released_at)
    if max_run_seconds is not None:
        annotations[contract.ANNOTATION_MAX_RUN_SECONDS] = str(max_run_seconds)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec, "status": status}


def make_pod(
    rank: int,
    attempt: int = 0,
    phase: str = "Running",
    *,
    ready: bool = True,
    bound: bool = True,
    exit_code: int | None = None,
    deleting: bool = False,
    owner_uid: str = "uid-1",
    finished_at: datetime | None = None,
    job: str = "demo",
    gated: bool = False,
    placed_node: str | None = None,
    released_at: datetime | None = None,
    **body_options: Any,
) -> WorkerPod:
    """`body_options`: container_reason, pod_reason, conditions, pod_ip, max_run_seconds
    (see make_pod_body)."""
    pod = observe_pod(
        make_pod_body(
            rank,
            attempt,
            phase,
            ready=ready,
            bound=bound,
            exit_code=exit_code,
            deleting=deleting,
            owner_uid=owner_uid,
            finished_at=finished_at,
            job=job,
            gated=gated,
            placed_node=placed_node,
            released_at=released_at,
            **body_options,
        )
    )
    assert pod is not None, "the factory must build a well-formed worker pod"
    return pod


def running(workers: int = 2, attempt: int = 0) -> list[WorkerPod]:
    """A whole gang Running and ready."""
    return [make_pod(rank, attempt) for rank in range(workers)]


def pod_name(rank: int, attempt: int = 0, job: str = "demo") -> str:
    return worker_pod_name(job, rank, attempt)
