"""Feed a gang mix to a live cluster one job at a time and record where each job landed.

Arrivals are sequential: before job i is submitted, the jobs that leave are deleted and
their pods waited out, the free GPUs per node are read from the pods bound at that moment
(the same snapshot code the operator uses), and only then is job i submitted and watched
until every worker is bound or the placer says it cannot place the whole gang. So "did some
rack have room for it" is exact, not estimated from a racing stream, and both placers see
the same arrivals and departures.

A job that cannot be placed whole is withdrawn at once (deleted) in either phase, so later
arrivals see only whole jobs: for trainwave that is a gang waiting behind its gate (it holds
nothing); for plain pods it is whatever part kube-scheduler bound, recorded before deletion.

Two placers, one interface (`Placer`): trainwave (TrainingJobs; the operator gates, places
and releases) and kube-scheduler (the same workers as bare Pods, default profile).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from benchmarks.gang_mix import (
    PLAIN_INDEX_LABEL,
    PLAIN_JOB_LABEL,
    MixJob,
    departures,
    plain_pods,
    training_job,
)
from benchmarks.placement_quality import Fleet
from trainwave import contract
from trainwave.placement.snapshot import ClusterSnapshot, build_snapshot

Pod = dict[str, Any]
POLL_SECONDS = 0.1
STUCK_CHECK_SECONDS = 1.0
JOB_TIMEOUT_SECONDS = 90.0
GONE_TIMEOUT_SECONDS = 120.0
# Scheduled=False reasons that mean "the operator is still at it", not "no room".
TRAINWAVE_BUSY_REASONS = ("Placing", "WaitingForNodes", "WaitingForPreferredLevel")


class Placer(Protocol):
    name: str

    def submit(self, job: MixJob) -> None: ...
    def workers(self, job: MixJob) -> list[Pod]: ...
    def rank(self, pod: Pod) -> int: ...
    def why_stuck(self, job: MixJob, pods: list[Pod]) -> str | None: ...
    def withdraw(self, job: MixJob) -> None: ...


@dataclass(frozen=True)
class Arrival:
    """One job of the mix as one placer handled it."""

    job: str
    workers: int
    gpus_per_worker: int
    multi_node: bool
    cluster_use_before: float  # share of all GPUs bound when it arrived
    rack_had_room: bool  # some rack had free whole-worker slots for every worker
    cluster_had_room: bool  # the cluster had, ignoring racks
    outcome: str  # placed | not-placed | partly-bound | timeout
    workers_bound: int
    seconds_to_all_bound: float | None  # submit -> last worker bound (polled every 0.1 s)
    nodes: tuple[str | None, ...]  # by rank; None = not bound
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class PhaseRun:
    arrivals: list[Arrival]
    # "4x8" -> the worker container's resources as the API server stored them (defaults
    # applied): the evidence that both placers were asked for the same thing.
    worker_resources: dict[str, Any]


class Api:
    """The few raw calls the benchmark makes, as the admin, decoded to plain dicts."""

    def __init__(self, kubeconfig: str, namespace: str):
        from kubernetes import client, config

        self.api = config.new_client_from_config(config_file=kubeconfig)
        self.core = client.CoreV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        self.namespace = namespace

    def pods(self, selector: str = "", all_namespaces: bool = False) -> list[Pod]:
        if all_namespaces:
            raw = self.core.list_pod_for_all_namespaces(_preload_content=False)
        else:
            raw = self.core.list_namespaced_pod(
                self.namespace, label_selector=selector, _preload_content=False
            )
        items: list[Pod] = json.loads(raw.data)["items"]
        return items

    def nodes(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = json.loads(self.core.list_node(_preload_content=False).data)[
            "items"
        ]
        return items

    def snapshot(self, nodes: list[dict[str, Any]]) -> ClusterSnapshot:
        """Free GPUs as the bound pods of every namespace leave them, right now."""
        return build_snapshot(nodes, self.pods(all_namespaces=True))


class TrainwavePlacer:
    name = "trainwave"

    def __init__(self, api: Api):
        self.api = api

    def submit(self, job: MixJob) -> None:
        self.api.custom.create_namespaced_custom_object(
            contract.GROUP, contract.VERSION, self.api.namespace, contract.PLURAL,
            training_job(job),
        )  # fmt: skip

    def workers(self, job: MixJob) -> list[Pod]:
        return self.api.pods(f"{contract.LABEL_JOB_NAME}={job.name}")

    def rank(self, pod: Pod) -> int:
        return int(pod["metadata"]["labels"][contract.LABEL_RANK])

    def why_stuck(self, job: MixJob, pods: list[Pod]) -> str | None:
        body = self.api.custom.get_namespaced_custom_object(
            contract.GROUP, contract.VERSION, self.api.namespace, contract.PLURAL, job.name
        )
        scheduled = _condition(body, "Scheduled") or {}
        if scheduled.get("status") != "False" or scheduled["reason"] in TRAINWAVE_BUSY_REASONS:
            return None
        return f"{scheduled['reason']}: {scheduled['message']}"

    def withdraw(self, job: MixJob) -> None:
        # Background: the job goes now, its pods by garbage collection (ownerReferences).
        self.api.custom.delete_namespaced_custom_object(
            contract.GROUP, contract.VERSION, self.api.namespace, contract.PLURAL, job.name,
            propagation_policy="Background",
        )  # fmt: skip


class SchedulerPlacer:
    name = "kube-scheduler"

    def __init__(self, api: Api):
        self.api = api

    def submit(self, job: MixJob) -> None:
        for pod in plain_pods(job):  # in index order, so the scheduling queue sees them so
            self.api.core.create_namespaced_pod(self.api.namespace, pod)

    def workers(self, job: MixJob) -> list[Pod]:
        return self.api.pods(f"{PLAIN_JOB_LABEL}={job.name}")

    def rank(self, pod: Pod) -> int:
        return int(pod["metadata"]["labels"][PLAIN_INDEX_LABEL])

    def why_stuck(self, job: MixJob, pods: list[Pod]) -> str | None:
        """Every worker either bound or marked Unschedulable: kube-scheduler is done trying."""
        reasons = []
        for pod in pods:
            if pod["spec"].get("nodeName"):
                continue
            scheduled = _condition(pod, "PodScheduled")
            if not scheduled or scheduled.get("reason") != "Unschedulable":
                return None
            reasons.append(scheduled.get("message", ""))
        return f"Unschedulable: {reasons[0]}" if len(pods) == job.workers and reasons else None

    def withdraw(self, job: MixJob) -> None:
        self.api.core.delete_collection_namespaced_pod(
            self.api.namespace, label_selector=f"{PLAIN_JOB_LABEL}={job.name}"
        )


def run_arrivals(placer: Placer, api: Api, mix: list[MixJob], log: Any = None) -> PhaseRun:
    """Every job of `mix` in order, with its departures; leaves the namespace empty."""
    nodes = api.nodes()
    fleet = Fleet(build_snapshot(nodes, []))
    leaving = departures(mix)
    present: set[str] = set()
    arrivals = []
    resources: dict[str, Any] = {}
    for job in mix:
        gone = [j for j in leaving.get(job.arrival, []) if j.name in present]
        _withdraw_all(placer, gone)
        present.difference_update(j.name for j in gone)
        snapshot = api.snapshot(nodes)
        arrival, pods = _arrive(placer, job, snapshot, fleet)
        arrivals.append(arrival)
        if pods:
            resources.setdefault(f"{job.workers}x{job.gpus_per_worker}", _worker_resources(pods[0]))
        if arrival.outcome == "placed":
            present.add(job.name)
        else:
            _withdraw_all(placer, [job])
        if log:
            print(f"  {placer.name} {_describe(arrival)}", file=log, flush=True)
    _withdraw_all(placer, [j for j in mix if j.name in present])
    return PhaseRun(arrivals, dict(sorted(resources.items())))


def _arrive(
    placer: Placer, job: MixJob, snapshot: ClusterSnapshot, fleet: Fleet
) -> tuple[Arrival, list[Pod]]:
    started = time.monotonic()
    placer.submit(job)
    next_stuck_check = started + STUCK_CHECK_SECONDS
    outcome, reason, elapsed = "timeout", f"not all bound after {JOB_TIMEOUT_SECONDS:.0f}s", None
    while True:
        pods = placer.workers(job)
        bound = [p for p in pods if p["spec"].get("nodeName")]
        now = time.monotonic()
        if len(pods) == job.workers and len(bound) == job.workers:
            outcome, reason, elapsed = "placed", "", now - started
            break
        if now >= next_stuck_check:
            next_stuck_check = now + STUCK_CHECK_SECONDS
            why = placer.why_stuck(job, pods)
            if why:
                outcome, reason = ("partly-bound" if bound else "not-placed"), why
                break
        if now - started > JOB_TIMEOUT_SECONDS:
            break
        time.sleep(POLL_SECONDS)
    by_rank = {placer.rank(p): p["spec"].get("nodeName") for p in pods}
    nodes = tuple(by_rank.get(rank) for rank in range(job.workers))
    seconds = round(elapsed, 2) if elapsed is not None else None
    arrival = arrival_record(
        job, snapshot, fleet, outcome=outcome, nodes=nodes, seconds=seconds, reason=reason
    )
    return arrival, pods


def arrival_record(
    job: MixJob,
    before: ClusterSnapshot,
    fleet: Fleet,
    *,
    outcome: str,
    nodes: tuple[str | None, ...],
    seconds: float | None = None,
    reason: str = "",
) -> Arrival:
    """What a job met (`before`: the cluster as it arrived) and where its workers went."""
    capacity = sum(node.gpus for node in before.nodes)
    slots = sum(free // job.gpus_per_worker for free in before.free)
    return Arrival(
        job=job.name,
        workers=job.workers,
        gpus_per_worker=job.gpus_per_worker,
        multi_node=job.multi_node,
        cluster_use_before=round(1 - sum(before.free) / capacity, 4),
        rack_had_room=fleet.rack_has_room(before.free, job.request()),
        cluster_had_room=slots >= job.workers,
        outcome=outcome,
        workers_bound=sum(node is not None for node in nodes),
        seconds_to_all_bound=seconds,
        nodes=nodes,
        reason=reason,
    )


def _withdraw_all(placer: Placer, jobs: list[MixJob]) -> None:
    """Delete, then wait until no pod of theirs is left, so the next snapshot is settled."""
    for job in jobs:
        placer.withdraw(job)
    deadline = time.monotonic() + GONE_TIMEOUT_SECONDS
    for job in jobs:
        while placer.workers(job):
            if time.monotonic() > deadline:
                raise TimeoutError(f"pods of {job.name} still there {GONE_TIMEOUT_SECONDS:.0f}s "
                                   "after it was deleted")  # fmt: skip
            time.sleep(POLL_SECONDS)


def _worker_resources(pod: Pod) -> Any:
    containers = pod["spec"]["containers"]
    return next(c for c in containers if c["name"] == contract.WORKER_CONTAINER)["resources"]


def _condition(body: dict[str, Any], kind: str) -> dict[str, Any] | None:
    conditions = body.get("status", {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == kind), None)


def _describe(arrival: Arrival) -> str:
    took = f"{arrival.seconds_to_all_bound:.2f}s" if arrival.seconds_to_all_bound else "-"
    nodes = ",".join((n or "-").rsplit("-", 2)[-2] for n in arrival.nodes)
    return (f"{arrival.job}: {arrival.outcome} in {took}, use {arrival.cluster_use_before:.0%}, "
            f"rack room {arrival.rack_had_room}, racks [{nodes}] {arrival.reason}")  # fmt: skip
