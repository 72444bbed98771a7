"""Pods as the placer asks placement about them.

A pod not created yet is asked with what the built-in admission plugins will add
once it is stored (placing a gang at creation), and a running job's pods become a
preemption candidate (placement/preemption.py): its priority, preemptibility,
requests and workers per node.
"""

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from trainwave.api.trainingjob import JobKey
from trainwave.placement.preemption import RunningGang
from trainwave.placement.records import PodRecord
from trainwave.placement.requirements import PodNeeds

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


def _tolerates_no_execute(toleration: Mapping[str, Any], key: str) -> bool:
    """The plugin's own test: the key or an empty one, the NoExecute effect or any."""
    return toleration.get("key") in (key, "", None) and toleration.get("effect") in (
        "NoExecute", "", None,
    )  # fmt: skip


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
    return RunningGang(
        key=f"{key[0]}/{key[1]}",
        priority=first.priority,
        preemptible=first.preemptible,
        needs=PodNeeds(requests=current[0].requests),
        workers_by_node=tuple(sorted(counts.items())),
        preempted_at=_parse(first.preempted_at),
    )


def _parse(value: str) -> datetime | None:
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")) if value else None
    except ValueError:
        return None
