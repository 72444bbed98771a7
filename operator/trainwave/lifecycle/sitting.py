"""A worker sitting Pending on its node, and what the kubelet's Events say of it. Pure.

A pod bound to a node whose volumes cannot mount (a ConfigMap, Secret or claim that does
not exist) or whose sandbox cannot start (the network plugin failing) stays Pending, its
containers waiting in ContainerCreating, a reason the kubelet only gives in Warning Events
(`kubectl describe pod`). The job names the first such worker and the newest warning, as
it names a container the kubelet cannot start (observed.py `WorkerPod.stuck`); the
operator reads them (controller/pod_warnings.py).
"""

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from trainwave.lifecycle.observed import PodPhase, WorkerPod, parse_time

# A warning older than this says nothing of why the pod sits now: the kubelet repeats the
# ones that still hold on each retry of the volume or sandbox (at most about every 2
# minutes, its back-off's cap), which moves the Event's lastTimestamp.
WARNING_MAX_AGE = timedelta(minutes=5)
WARNING_MESSAGE_CHARS = 200


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


def latest_warning(events: Iterable[dict[str, Any]], now: datetime) -> str:
    """ "<reason>: <message>" of the newest Warning Event no older than WARNING_MAX_AGE;
    "" when there is none."""
    newest: tuple[datetime, str] | None = None
    for event in events:
        if event.get("type") != "Warning":
            continue
        when = _last_seen(event)
        if when is None or now - when > WARNING_MAX_AGE:
            continue
        if newest is None or when > newest[0]:
            message = " ".join(str(event.get("message") or "").split())
            said = f"{event.get('reason') or 'Warning'}: {message[:WARNING_MESSAGE_CHARS]}"
            newest = (when, said.rstrip(": "))
    return newest[1] if newest else ""


def _last_seen(event: dict[str, Any]) -> datetime | None:
    """When the Event last happened: a series' last observation, lastTimestamp (the core
    API's, which the kubelet writes), eventTime (events.k8s.io), or its creation."""
    series = event.get("series") or {}
    for value in (
        series.get("lastObservedTime"),
        event.get("lastTimestamp"),
        event.get("eventTime"),
        (event.get("metadata") or {}).get("creationTimestamp"),
    ):
        when = parse_time(value) if value else None
        if when is not None:
            return when
    return None
