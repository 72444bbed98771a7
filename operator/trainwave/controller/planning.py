"""`trainwave plan`: where would this job's workers go, on the live cluster, and why.

A dry run of the placement engine against a snapshot of the nodes and the pods
bound to them right now. Nothing is written. The operator does not place
gangs itself yet (kube-scheduler binds each pod); this shows what placement
will do once it does, and explains a "no" with numbers.
"""

import json
from collections.abc import Sequence
from typing import Any

from kubernetes import client

from trainwave.api.trainingjob import parse_trainingjob
from trainwave.placement.gang import GangRequest, Placement, Unschedulable, place
from trainwave.placement.snapshot import build_snapshot
from trainwave.placement.topology import DEFAULT_LEVELS

# Pods that hold nothing are left out of the listing the snapshot needs.
_ACTIVE_PODS = "status.phase!=Succeeded,status.phase!=Failed"


def plan(
    manifest: dict[str, Any], api: client.ApiClient, levels: Sequence[str] = DEFAULT_LEVELS
) -> Placement | Unschedulable:
    body = {**manifest, "metadata": {"namespace": "default", "uid": "plan", **manifest["metadata"]}}
    job = parse_trainingjob(body)
    core = client.CoreV1Api(api)
    nodes = _items(core.list_node(_preload_content=False))
    pods = _items(
        core.list_pod_for_all_namespaces(field_selector=_ACTIVE_PODS, _preload_content=False)
    )
    snapshot = build_snapshot(nodes, pods, levels=levels)
    request = GangRequest(
        name=job.metadata.name,
        workers=job.spec.workers,
        gpus_per_worker=job.spec.gpus_per_worker,
        preferred_level=levels[-2] if len(levels) > 1 else None,
        node_selector=dict(job.spec.template.spec.get("nodeSelector") or {}),
    )
    return place(snapshot, request)


def render(result: Placement | Unschedulable) -> str:
    if isinstance(result, Unschedulable):
        return f"{result.job}: cannot be placed now ({result.code}): {result.reason}"
    lines = [f"{result.job}: {result.describe()}"]
    lines += [f"  rank {rank:>4} -> {node}" for rank, node in enumerate(result.nodes)]
    return "\n".join(lines)


def _items(response: Any) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = json.loads(response.data)["items"]
    return items
