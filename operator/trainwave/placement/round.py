"""One placement round: (snapshot, tickets, now) -> admissions, refusals, preemptions. Pure.

The operator's placer is I/O around this function, and `trainwave plan` calls it
on a fresh snapshot with one ticket, so the two give the same answer for the
same cluster: whole-GPU, shared-GPU, CPU-only and RDMA gangs alike.

Order of questions for each ticket:
1. Requirements the cluster lacks outright (the RDMA link layer or GPUDirect a
   job asks for, as node labels): no node at all has them, busy or not. Waiting
   cannot help; the job fails with the reason (lifecycle/placing.py).
2. The queue (queueing.py): priority, arrival, bounded backfill, all or nothing,
   whole-GPU and shared-GPU gangs under the same rules.
3. Preemption (preemption.py): a gang still waiting may evict lower-priority
   whole gangs when that makes room for it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from trainwave.api.network import NetworkSpec
from trainwave.api.reasons import Reason
from trainwave.placement.backfill import RunBounds
from trainwave.placement.preemption import Preemption, RunningGang, plan_preemptions
from trainwave.placement.queueing import (
    WAITING_FOR_PREFERRED_LEVEL,
    Admit,
    PendingJob,
    QueuePolicy,
    Wait,
    schedule,
)
from trainwave.placement.rdma import rdma_shortfall
from trainwave.placement.shared_tasks import SharedShape
from trainwave.placement.snapshot import ClusterSnapshot

RDMA_UNAVAILABLE = Reason.RDMA_UNAVAILABLE


@dataclass(frozen=True)
class Ticket:
    """A gang that asks for a place this round."""

    job: PendingJob
    network: NetworkSpec | None = None  # its RDMA labels are in job.request.node_selector


@dataclass(frozen=True)
class Round:
    admitted: tuple[Admit, ...]
    waiting: tuple[Wait, ...]
    preemptions: tuple[Preemption, ...] = ()


def plan_round(
    snapshot: ClusterSnapshot,
    tickets: Iterable[Ticket],
    now: datetime,
    *,
    policy: QueuePolicy | None = None,
    shared_shapes: Iterable[SharedShape] = (),
    running: Sequence[RunningGang] = (),
    bounds: RunBounds | None = None,
) -> Round:
    """Decide one round; nothing is remembered between rounds but `PendingJob.skipped`.
    `bounds`: the running gangs' ends, for the queue's backfill onto held room (rule 9)."""
    unavailable: list[Wait] = []
    queued: list[PendingJob] = []
    for ticket in tickets:
        missing = rdma_shortfall(ticket.network, ticket.job.request.node_selector, snapshot)
        if missing is not None:
            unavailable.append(Wait(ticket.job, RDMA_UNAVAILABLE, missing, 0))
        else:
            queued.append(ticket.job)
    result = schedule(snapshot, queued, policy, shared_shapes, bounds)
    preemptions: tuple[Preemption, ...] = ()
    # A gang waiting for its preferred domain fits now, spread: it waits by choice, and
    # no running gang is evicted to spare it that (rule 8 of queueing.py).
    short = [w for w in result.waiting if w.code != WAITING_FOR_PREFERRED_LEVEL]
    if running and short:
        preemptions = plan_preemptions(result.snapshot, short, running, now)
    return Round(result.admitted, (*unavailable, *result.waiting), preemptions)
