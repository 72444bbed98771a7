"""What trainwave's pure engine decides for the same arrival stream, with no cluster at all.

The operator's placer runs schedule() on a snapshot of the live cluster with the gang the
builders derive from the TrainingJob. The replay does the same with the same mix, the same
departures and withdrawals, the request built from the same manifest by the same code, and
the same schedule() call. When the live phase and the replay put every job on the same
nodes, the operator places exactly as placement/ decides: nothing between the decision and
the binding (gates, pinning, kube-scheduler binding pinned pods) moved a worker.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from benchmarks.gang_arrivals import Arrival, arrival_record
from benchmarks.gang_mix import MixJob, departures, training_job
from benchmarks.placement_quality import Fleet
from trainwave.api.trainingjob import parse_trainingjob
from trainwave.placement.queueing import Admit, PendingJob, schedule
from trainwave.placement.snapshot import build_snapshot
from trainwave.placement.topology import DEFAULT_LEVELS
from trainwave.resolving import gang_request


def replay(mix: list[MixJob], nodes: Sequence[dict[str, Any]]) -> list[Arrival]:
    snapshot = build_snapshot(nodes, [])
    fleet = Fleet(snapshot)
    leaving = departures(mix)
    held: dict[str, dict[str, int]] = {}
    arrivals = []
    for job in mix:
        for gone in leaving.get(job.arrival, []):
            if gone.name in held:
                snapshot = snapshot.with_usage({n: -g for n, g in held.pop(gone.name).items()})
        request = gang_request(parse_trainingjob(_as_stored(job)), DEFAULT_LEVELS)
        decision = schedule(snapshot, [PendingJob(job.name, request)]).decisions[0]
        if isinstance(decision, Admit):
            placement = decision.placement
            arrivals.append(
                arrival_record(job, snapshot, fleet, outcome="placed", nodes=placement.nodes)
            )
            held[job.name] = placement.gpus_by_node()
            snapshot = snapshot.with_usage(held[job.name])
        else:
            reason = f"{decision.code}: {decision.reason}"
            unbound = (None,) * job.workers
            record = arrival_record(
                job, snapshot, fleet, outcome="not-placed", nodes=unbound, reason=reason
            )
            arrivals.append(record)
    return arrivals


def _as_stored(job: MixJob) -> dict[str, Any]:
    """The manifest with what the API server adds before the operator ever reads it."""
    body = training_job(job)
    body["metadata"] |= {"namespace": "replay", "uid": f"replay-{job.name}"}
    return body


def agreement(live: list[Arrival], replayed: list[Arrival]) -> dict[str, Any]:
    """How many jobs got the same outcome and the same node for every rank, live and replayed."""
    differing = [a.job for a, b in zip(live, replayed, strict=True)
                 if (a.outcome, a.nodes) != (b.outcome, b.nodes)]  # fmt: skip
    return {"jobs": len(live), "same_nodes": len(live) - len(differing), "differing": differing}
