"""`trainwave plan`: where would this job's workers go, on the live cluster, and why.

A dry run of the placement engine against a snapshot of the nodes and the pods
on them right now (released gangs not bound yet included), asking exactly
what the operator's placer would ask for this job alone: the live queue may
hold others ahead of it. Nothing is written; a "no" is explained with numbers.
"""

from collections.abc import Sequence
from typing import Any

from trainwave.api.trainingjob import parse_trainingjob
from trainwave.builders.gangs import gang_request
from trainwave.controller.kube import KubeClient
from trainwave.controller.placer import reserved_gpus
from trainwave.placement.gang import Placement, Unschedulable, place
from trainwave.placement.snapshot import build_snapshot
from trainwave.placement.topology import DEFAULT_LEVELS


def plan(
    manifest: dict[str, Any], kube: KubeClient, levels: Sequence[str] = DEFAULT_LEVELS
) -> Placement | Unschedulable:
    body = {**manifest, "metadata": {"namespace": "default", "uid": "plan", **manifest["metadata"]}}
    job = parse_trainingjob(body)
    pods = kube.list_active_pods()
    snapshot = build_snapshot(kube.list_nodes(), pods, levels=levels, reserved=reserved_gpus(pods))
    return place(snapshot, gang_request(job, levels))


def render(result: Placement | Unschedulable) -> str:
    if isinstance(result, Unschedulable):
        return f"{result.job}: cannot be placed now ({result.code}): {result.reason}"
    lines = [f"{result.job}: {result.describe()}"]
    lines += [f"  rank {rank:>4} -> {node}" for rank, node in enumerate(result.nodes)]
    return "\n".join(lines)
