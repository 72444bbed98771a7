"""`trainwave plan`: where would this job's workers go, on the live cluster, and why.

The same pure round the operator's placer runs (placement.round.plan_round), on a
view built from one fresh listing of nodes and pods (released gangs not bound yet
included), with this job as the only ticket: the live queue may hold others ahead
of it. The job's worker pod is built by the operator's own builders and given the
tolerations DefaultTolerationSeconds admission adds, so the filters see the pod
kube-scheduler will see. Whole-GPU, shared-GPU, CPU-only and RDMA jobs alike;
nothing is written; a "no" is explained with numbers.
"""

from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from trainwave.builders.pods import build_worker_pods
from trainwave.controller.clusterview import ClusterView, listed_view
from trainwave.controller.kube import KubeClient
from trainwave.placement.gang_types import Placement
from trainwave.placement.queueing import PendingJob, Wait
from trainwave.placement.requirements import pod_needs, with_default_tolerations
from trainwave.placement.round import Ticket, plan_round
from trainwave.placement.sharing import SharedPlacement
from trainwave.placement.topology import DEFAULT_LEVELS
from trainwave.resolving import resolve

Answer = Placement | SharedPlacement | Wait


def plan(
    manifest: dict[str, Any], kube: KubeClient, levels: Sequence[str] = DEFAULT_LEVELS
) -> Answer:
    return plan_on(manifest, listed_view(kube), levels)


def plan_on(
    manifest: dict[str, Any], view: ClusterView, levels: Sequence[str] = DEFAULT_LEVELS
) -> Answer:
    """The placer's answer for this one job on `view` (pure; tests replay it)."""
    body = {**manifest, "metadata": {"namespace": "default", "uid": "plan", **manifest["metadata"]}}
    resolved = resolve(body, levels)
    job = resolved.job
    [pod] = build_worker_pods(resolved, (0,), job.status.attempt)
    request = replace(resolved.gang, pod=with_default_tolerations(pod_needs(pod)))
    created = job.metadata.creationTimestamp
    name = f"{job.metadata.namespace}/{job.metadata.name}"
    ticket = Ticket(
        PendingJob(
            name, request, job.spec.placement.priority, created.timestamp() if created else 0.0
        ),
        job.spec.network,
    )
    snapshot = view.snapshot(tuple(levels))
    result = plan_round(snapshot, [ticket], datetime.now(UTC), shared_shapes=view.shared_shapes)
    if result.admitted:
        return result.admitted[0].placement
    return result.waiting[0]


def render(result: Answer) -> str:
    if isinstance(result, Wait):
        job = result.job.key.partition("/")[2]
        return f"{job}: cannot be placed now ({result.code}): {result.reason}"
    if isinstance(result, SharedPlacement):
        lines = [f"{result.job}: {result.describe()}"]
        lines += [f"  rank {r:>4} -> {p.node} GPU {p.gpu_uuid}" for r, p in enumerate(result.pins)]
        return "\n".join(lines)
    lines = [f"{result.job}: {result.describe()}"]
    lines += [f"  rank {rank:>4} -> {node}" for rank, node in enumerate(result.nodes)]
    return "\n".join(lines)
