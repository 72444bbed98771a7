"""What the placer asks placement: each gang's Ticket and its pods, as placement sees them.

The gated pods of each ticketed gang (`gated_gangs`), the topology domains of a partly
released gang's running workers, where its replacement is tried first
(`gang_domains`). A pod not created yet is asked with what the built-in admission plugins will add
once it is stored (placing a gang at creation), and a running job's pods become a
preemption candidate (placement/preemption.py): its priority, preemptibility,
requests and workers per node.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

from trainwave import contract
from trainwave.api.network import NetworkSpec
from trainwave.api.trainingjob import JobKey
from trainwave.controller.clusterview import ClusterView
from trainwave.placement.backfill import BoundedGang, RunBounds
from trainwave.placement.gang_types import GangRequest
from trainwave.placement.preemption import RunningGang
from trainwave.placement.records import PodRecord
from trainwave.placement.requirements import PodNeeds, pod_needs


@dataclass(frozen=True)
class Ticket:
    """A gang waiting for a place: its attempt and what it needs beyond its pods' specs."""

    attempt: int
    request: GangRequest  # the stored pods add their needs (tolerations, requests...)
    priority: int = 0
    arrival: float = 0.0
    network: NetworkSpec | None = None  # for the NCCL settings of each chosen node
    shared_how: str = ""  # where a shared request's MiB came from, for the messages
    spread_wait: float = 0.0  # preferredLevelWaitSeconds: rule 8 of placement/queueing.py
    # Workers of this attempt that already ran to completion: a gang whose operator died
    # between two of its release patches (or creates), back after the released worker
    # ended. They hold nothing and leave the cache's active pods, yet belong to the gang.
    finished: int = 0


# What the DefaultTolerationSeconds admission plugin adds to a pod that lacks them
# (plugin/pkg/admission/defaulttolerationseconds): a pod placed before it exists is
# asked with the tolerations it will have once stored.
_DEFAULT_TOLERATION_KEYS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")


def with_admission_defaults(pod: Mapping[str, Any]) -> dict[str, Any]:
    """`pod` as the built-in admission plugins will store it, for placement's questions:
    the two NoExecute tolerations, unless the pod already tolerates those taints."""
    spec = dict(pod.get("spec") or {})
    tolerations = list(spec.get("tolerations") or [])
    for key in _DEFAULT_TOLERATION_KEYS:
        if not any(_tolerates_no_execute(t, key) for t in tolerations):
            tolerations.append(
                {"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
            )
    return {**pod, "spec": {**spec, "tolerations": tolerations}}


def changed_on_the_way_in(sent: Mapping[str, Any], stored: Mapping[str, Any]) -> str:
    """What admission changed that placing `sent` before it existed relied on, as the
    API server's dry run of its create answered with `stored`; "" when nothing did.
    Labels, annotations, environment and the like may change: placement reads none of
    them (a spread constraint's own labels are part of its needs)."""
    try:
        expected, found = pod_needs(with_admission_defaults(sent)), pod_needs(stored)
    except ValueError as error:  # a quantity a webhook wrote that placement cannot read
        return f"an unreadable quantity: {error}"
    for field in fields(PodNeeds):
        if getattr(expected, field.name) != getattr(found, field.name):
            return field.name.replace("_", " ")
    gates = [(g or {}).get("name") for g in (stored.get("spec") or {}).get("schedulingGates") or ()]
    if gates:
        return f"scheduling gates {', '.join(map(str, gates))}"
    return ""


def _tolerates_no_execute(toleration: Mapping[str, Any], key: str) -> bool:
    """The plugin's own test: the key or an empty one, the NoExecute effect or any."""
    return toleration.get("key") in (key, "", None) and toleration.get("effect") in (
        "NoExecute", "", None,
    )  # fmt: skip


def gang_domains(
    levels: Sequence[str], labels: Mapping[str, Mapping[str, str]], nodes: Sequence[str]
) -> list[dict[str, str]]:
    """Where a partly released gang's running workers are (`nodes`, their nodes' `labels`),
    as node selectors, narrowest first: one per topology level above the node (the last
    level) at which all of them share one domain ({rack: r1}, then {spine: s1}). A
    replacement worker is placed inside the first that has room (controller/placer.py)."""
    found: list[dict[str, str]] = []
    for level in reversed(levels[:-1]):
        values = {labels.get(node, {}).get(level) for node in nodes}
        if len(values) == 1 and None not in values:
            found.append({level: str(values.pop())})
    return found


def running_gang(key: JobKey, pods: Sequence[PodRecord]) -> RunningGang | None:
    """One job's holding worker pods as a preemption candidate; None when none is live."""
    live = [p for p in pods if not p.deleting and p.worker is not None]
    if not live:
        return None
    attempt = max(p.worker.attempt for p in live if p.worker)
    current = [p for p in live if p.worker and p.worker.attempt == attempt]
    first = current[0].worker
    assert first is not None
    counts: dict[str, int] = {}
    for pod in current:
        counts[pod.node] = counts.get(pod.node, 0) + 1
    # The gang is stopped at its earliest pod's bound (lifecycle/decide.py `_past_max_run`).
    ends = [p.worker.run_until for p in current if p.worker and p.worker.run_until is not None]
    return RunningGang(
        key=f"{key[0]}/{key[1]}",
        priority=first.priority,
        preemptible=first.preemptible,
        needs=PodNeeds(requests=current[0].requests),
        workers_by_node=tuple(sorted(counts.items())),
        preempted_at=_parse(first.preempted_at),
        run_until=min(ends) if ends else None,
    )


def run_bounds(running: Sequence[RunningGang], now: float) -> RunBounds:
    """The running gangs' ends for the queue's rule 9: whole-GPU gangs with a bound only
    (a shared worker's GPU memory is not given back in that count)."""
    gangs = tuple(
        BoundedGang(gang.run_until, gang.needs, gang.workers_by_node)
        for gang in running
        if gang.run_until is not None
        and not dict(gang.needs.requests).get(contract.SHARED_GPU_MEMORY_RESOURCE, 0)
    )
    return RunBounds(now, gangs)


def _parse(value: str) -> datetime | None:
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")) if value else None
    except ValueError:
        return None


def gated_gangs(
    view: ClusterView, tickets: Mapping[JobKey, Ticket]
) -> dict[JobKey, list[PodRecord]]:
    """The gated pods of each ticket's attempt, in rank order, for gangs the cache sees
    whole: gated plus already released pods of the attempt, plus those the ticket says
    finished, make every worker. A gang the watch has not fully caught up with waits for
    the next round (placing the part it sees would break all-or-nothing; a finished pod
    the cache still shows counts twice, so it waits too); a partly released gang gets the
    rest placed."""
    gangs: dict[JobKey, list[PodRecord]] = {}
    for key, ticket in tickets.items():
        gated = [
            p
            for p in view.gated.get(key, ())
            if p.worker is not None and p.worker.attempt == ticket.attempt
        ]
        released = [
            p
            for p in view.workers.get(key, ())
            if p.worker is not None and p.worker.attempt == ticket.attempt and not p.gated
            and not p.deleting  # a replaced worker's old pod, still terminating
        ]  # fmt: skip
        whole = len(gated) + len(released) + ticket.finished == ticket.request.workers
        if gated and whole and all(p.needs is not None for p in gated):
            gangs[key] = sorted(gated, key=lambda p: p.worker.rank if p.worker else 0)
    return gangs
