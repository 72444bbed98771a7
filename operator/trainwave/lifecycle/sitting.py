"""A worker sitting Pending on its node, and what its Events say of it. Pure.

A pod bound to a node whose volumes cannot mount (a ConfigMap or Secret that does not exist),
whose sandbox cannot start (the network plugin failing) or whose large image is still being
pulled stays Pending, its containers waiting in ContainerCreating: the reason is only in the
kubelet's Events (`kubectl describe pod`). The job names the first such worker and what its
newest Event says, as it names a container the kubelet cannot start (observed.py
`WorkerPod.stuck`); the operator lists them (controller/pod_events.py).
"""

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from trainwave.lifecycle.observed import PodPhase, WorkerPod, parse_time, worded

# An Event older than this says nothing of why the pod sits now: the kubelet repeats the
# warnings that still hold on each retry of the volume or sandbox (at most about every 2
# minutes, its back-off's cap), which moves the Event's lastTimestamp.
EVENT_MAX_AGE = timedelta(minutes=5)
# The one Normal Event that explains a wait: a large image being pulled (the kubelet's
# events.PullingImage). The others (Scheduled, Pulled, Created) say it moved on.
PULLING = "Pulling"


def sits_pending(pod: WorkerPod, attempt: int) -> bool:
    """On its node, released, not running and not failing to start a container (that is
    `stuck`, read from the pod itself): what only its Events can explain."""
    return (
        pod.attempt == attempt
        and bool(pod.uid)
        and pod.bound
        and not pod.gated
        and pod.phase == PodPhase.PENDING
        and not pod.stuck
        and not pod.deleting
        and not pod.departed
    )


def explaining_event(events: Iterable[dict[str, Any]], now: datetime) -> str:
    """ "<reason>: <message>" of the pod's newest Event when it explains the wait: a Warning
    (FailedMount, FailedCreatePodSandBox...) or the kubelet pulling an image, no older than
    EVENT_MAX_AGE; "" otherwise. Only the newest counts: a warning followed by progress (a
    ConfigMap created at last, then the image pulled) no longer explains anything.

    Of Events of that second with the newest's reason, the longest message is said: the
    kubelet reports a failed pull twice under reason `Failed` (k8s.io/kubernetes
    pkg/kubelet/images/image_manager.go, then kuberuntime_container.go), "Failed to pull
    image "<image>": <why>" and then "Error: ErrImagePull", which alone says neither."""
    dated = [(when, _revision(e), e) for e in events if (when := _last_seen(e)) is not None]
    if not dated:
        return ""
    when, _, newest = max(dated, key=lambda found: found[:2])
    reason = _reason(newest)
    explains = newest.get("type") == "Warning" or reason == PULLING
    if not explains or now - when > EVENT_MAX_AGE:
        return ""
    twins = (_message(e) for at, _, e in dated if at == when and _reason(e) == reason)
    return worded(reason or str(newest.get("type")), max(twins, key=len))


def _reason(event: dict[str, Any]) -> str:
    return str(event.get("reason") or "")


def _message(event: dict[str, Any]) -> str:
    return " ".join(str(event.get("message") or "").split())


def _revision(event: dict[str, Any]) -> int:
    """Orders Events of the same second: the later write has the higher resourceVersion, an
    etcd revision on every API server we know of."""
    version = str((event.get("metadata") or {}).get("resourceVersion") or "")
    return int(version) if version.isdigit() else 0


def _last_seen(event: dict[str, Any]) -> datetime | None:
    """When the Event last happened, to the second: a series' last observation,
    lastTimestamp (the core API's, which the kubelet writes), eventTime (events.k8s.io,
    which kube-scheduler writes), or its creation. Whole seconds, because lastTimestamp
    has no more: kube-scheduler's `Scheduled` at 12.4 s must not read as newer than the
    kubelet's `Pulling` written after it at "12 s"."""
    series = event.get("series") or {}
    for value in (
        series.get("lastObservedTime"),
        event.get("lastTimestamp"),
        event.get("eventTime"),
        (event.get("metadata") or {}).get("creationTimestamp"),
    ):
        when = parse_time(value) if value else None
        if when is not None:
            return when.replace(microsecond=0)
    return None
