"""What the operator observed of one worker pod and its node, reduced to what decisions need.

Pure. `observe_pod` reads a raw Pod body once; everything downstream works
with the frozen `WorkerPod`, whose strings are interned: a gang's workers repeat the
same node, owner, placement summary and condition words, each watch event decodes
fresh copies of them, and 8,000 workers kept 64,000 conditions' worth. `NodeHealth`
is what the controller's node cache says of a worker's node, passed in as plain data.
"""

import re
import signal
import sys
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from trainwave import contract


class PodPhase(StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    UNKNOWN = "Unknown"


# The condition Kubernetes sets (True) on a pod before it preempts, evicts or deletes
# it for reasons outside the pod (k8s.io/api core/v1 DisruptionTarget; reasons
# PreemptionByScheduler, DeletionByTaintManager, EvictionByEvictionAPI,
# DeletionByPodGC, TerminationByKubelet).
DISRUPTION_TARGET = "DisruptionTarget"
# Exit codes of a process killed by SIGTERM or SIGKILL: 128 + the signal, as the container
# runtime reports them.
SIGNALLED_EXITS = (128 + signal.SIGTERM, 128 + signal.SIGKILL)


@dataclass(frozen=True, slots=True)
class PodCondition:
    type: str
    status: str
    reason: str = ""


@dataclass(frozen=True)
class NodeHealth:
    """A worker's node as the node cache sees it; `present=False`: the Node object is gone."""

    present: bool
    ready: bool = True
    not_ready_since: datetime | None = None


@dataclass(frozen=True)
class WorkerPod:
    name: str
    owner_uid: str
    rank: int
    attempt: int
    phase: PodPhase
    ready: bool
    bound: bool
    deleting: bool
    exit_code: int | None
    reason: str
    finished_at: datetime | None
    # Placement: still behind trainwave's scheduling gate; once released, the
    # node the engine chose, when, and how the gang sits.
    gated: bool = False
    placed_node: str = ""
    released_at: datetime | None = None
    max_run_seconds: int = 0  # runPolicy.maxRunSeconds as the pod carries it; 0: unbounded
    placement_summary: str = ""
    pod_ip: str = ""
    preempted_by: str = ""  # the gang whose placement evicted this one (namespace/name)
    node: str = ""  # spec.nodeName
    container_reason: str = ""  # the worker container's terminated reason (OOMKilled, Error)
    pod_reason: str = ""  # status.reason (Evicted, Terminated, OutOfcpu...)
    conditions: tuple[PodCondition, ...] = ()
    uid: str = ""
    serial: int = 0  # a worker replaced alone: its replacement's serial (label), else 0
    # Gone from the API (its DELETED event seen), kept by controller/departures.py as
    # evidence: a name that may be created again.
    departed: bool = False
    # When its deletion was asked for: deletionTimestamp less deletionGracePeriodSeconds,
    # which a later, shorter delete keeps while the new time is still ahead
    # (k8s.io/apiserver pkg/registry/rest/delete.go, BeforeDelete). The kubelet's final
    # delete (grace 0, after the containers ended) moves deletionTimestamp to now, so a
    # grace of 0 says nothing of the first request: None then.
    delete_asked_at: datetime | None = None
    # Why the pod does not start, in the words of whoever holds it: a container the kubelet
    # cannot start, "container <name> waiting: <reason>: <message>" (ErrImagePull,
    # ImagePullBackOff, CreateContainerConfigError...), or a pod kube-scheduler cannot
    # place, "not scheduled: <reason>: <message>" (Unschedulable); "" while it starts
    # normally, runs, or waits behind trainwave's gate.
    stuck: str = ""
    # Sitting Pending on its node with no container to blame (lifecycle/sitting.py): what
    # its newest Event says when that explains the wait (a warning, an image being pulled),
    # "<reason>: <message>", as the reconciler listed it (controller/pod_events.py).
    event_says: str = ""

    @property
    def disruption(self) -> str:
        """The reason of a DisruptionTarget=True condition, or "". Only True counts: the
        disruption controller flips a stale one to False after 2 minutes."""
        return next(
            (
                c.reason or DISRUPTION_TARGET
                for c in self.conditions
                if c.type == DISRUPTION_TARGET and c.status == "True"
            ),
            "",
        )

    @property
    def run_until(self) -> datetime | None:
        """When runPolicy.maxRunSeconds stops this pod's gang: released-at plus the bound."""
        if not self.max_run_seconds or self.released_at is None:
            return None
        return self.released_at + timedelta(seconds=self.max_run_seconds)

    @property
    def ended_by_deletion(self) -> bool:
        """Finished because its deletion stopped it, so taken rather than failed. Seen late
        (a busy operator, a coalesced watch), such a pod is Failed already. Evidence, either:
        - its worker exited as a process killed by SIGTERM or SIGKILL does (143, 137; not
          OOMKilled): what the kubelet sends a deleted pod, and what trainwave's launcher
          reports when SIGTERM stopped torch's agent (runtime/launcher/supervisor.py);
        - it finished no earlier than its deletion was asked for (both whole seconds, so a
          same-second end counts as the deletion's).
        Without either it is judged by its phase, as before."""
        if not (self.deleting and self.finished):
            return False
        if self.exit_code in SIGNALLED_EXITS and self.container_reason != "OOMKilled":
            return True
        if self.delete_asked_at is None or self.finished_at is None:
            return False
        return self.finished_at >= self.delete_asked_at

    @property
    def finished(self) -> bool:
        return self.phase in (PodPhase.SUCCEEDED, PodPhase.FAILED)

    @property
    def active(self) -> bool:
        """Holds or may soon hold resources: not finished and not already going away."""
        return not self.deleting and self.phase in (
            PodPhase.PENDING,
            PodPhase.RUNNING,
            PodPhase.UNKNOWN,
        )


def observe_pod(body: dict[str, Any]) -> WorkerPod | None:
    """A WorkerPod, or None for a pod that is not a well-formed trainwave worker."""
    metadata = body.get("metadata") or {}
    labels = metadata.get("labels") or {}
    try:
        rank = int(labels[contract.LABEL_RANK])
        attempt = int(labels[contract.LABEL_ATTEMPT])
        serial = int(labels.get(contract.LABEL_REPLACEMENT) or 0)
    except (KeyError, ValueError):
        return None
    owner_uid = next(
        (
            ref.get("uid", "")
            for ref in metadata.get("ownerReferences") or []
            if ref.get("kind") == contract.KIND and ref.get("controller")
        ),
        "",
    )
    status = body.get("status") or {}
    annotations = metadata.get("annotations") or {}
    gates = (body.get("spec") or {}).get("schedulingGates") or []
    try:
        phase = PodPhase(status.get("phase", "Pending"))
    except ValueError:
        phase = PodPhase.UNKNOWN
    terminated = _worker_termination(status)
    return WorkerPod(
        name=_text(metadata.get("name")),
        uid=_text(metadata.get("uid")),
        owner_uid=_text(owner_uid),
        rank=rank,
        attempt=attempt,
        serial=serial,
        phase=phase,
        ready=_condition_true(status, "Ready"),
        bound=bool((body.get("spec") or {}).get("nodeName")),
        deleting=metadata.get("deletionTimestamp") is not None,
        exit_code=terminated.get("exitCode"),
        reason=_text(terminated.get("reason") or status.get("reason")),
        finished_at=parse_time(terminated.get("finishedAt")),
        gated=any(g.get("name") == contract.SCHEDULING_GATE for g in gates),
        placed_node=_text(annotations.get(contract.ANNOTATION_PLACED_NODE)),
        released_at=parse_time(annotations.get(contract.ANNOTATION_RELEASED_AT)),
        max_run_seconds=_seconds(annotations.get(contract.ANNOTATION_MAX_RUN_SECONDS)),
        placement_summary=_text(annotations.get(contract.ANNOTATION_PLACEMENT_SUMMARY)),
        pod_ip=_text(status.get("podIP")),
        preempted_by=_text(annotations.get(contract.ANNOTATION_PREEMPTED_BY)),
        node=_text((body.get("spec") or {}).get("nodeName")),
        container_reason=_text(terminated.get("reason")),
        pod_reason=_text(status.get("reason")),
        conditions=tuple(_conditions(status)),
        delete_asked_at=_delete_asked_at(metadata),
        stuck=_stuck(status),
    )


def _delete_asked_at(metadata: dict[str, Any]) -> datetime | None:
    at = parse_time(metadata.get("deletionTimestamp"))
    grace = metadata.get("deletionGracePeriodSeconds")
    if at is None or not isinstance(grace, int) or isinstance(grace, bool) or grace <= 0:
        return None
    return at - timedelta(seconds=grace)


# Waiting reasons of a container that is on its way (k8s.io/kubernetes pkg/kubelet
# kuberuntime and container/sync_result.go name the others: ErrImagePull,
# ImagePullBackOff, InvalidImageName, CreateContainerConfigError, ...).
_STARTING = frozenset({"ContainerCreating", "PodInitializing"})
# How much of a kube-scheduler, kubelet or Event message a job's status repeats.
MESSAGE_CHARS = 200
# kube-scheduler's PodScheduled reason while any scheduling gate holds the pod (k8s.io/api
# core/v1 PodReasonSchedulingGated): the placer's own wait, said on the job otherwise.
_GATED = "SchedulingGated"


def _stuck(status: dict[str, Any]) -> str:
    """Why the pod does not start: kube-scheduler's PodScheduled=False (not its gate), else
    the first container (init containers first, as the kubelet starts them) waiting for a
    reason other than starting, as the job's status names it; "" when none."""
    for condition in status.get("conditions") or []:
        if condition.get("type") != "PodScheduled" or condition.get("status") != "False":
            continue
        reason = condition.get("reason") or ""
        if reason and reason != _GATED:
            message = " ".join(str(condition.get("message") or "").split())
            return _text(worded(f"not scheduled: {reason}", message))
    for kind in ("initContainerStatuses", "containerStatuses"):
        for container in status.get(kind) or []:
            waiting = (container.get("state") or {}).get("waiting") or {}
            reason = waiting.get("reason")
            if reason and reason not in _STARTING:
                reason, message = _pull_error(reason, str(waiting.get("message") or ""))
                said = f"container {container.get('name')} waiting: {reason}"
                return _text(worded(said, message))
    return ""


# The kubelet's message while it backs off a failed pull, wrapping that pull's own reason
# and message (k8s.io/kubernetes pkg/kubelet/images/image_manager.go, since 1.33).
_PULL_BACK_OFF = re.compile(
    r'Back-off pulling image "[^"]*": (?P<reason>\w+): (?P<message>.+)', re.S
)


def _pull_error(reason: str, message: str) -> tuple[str, str]:
    """The failed pull itself for an ImagePullBackOff that wraps it: the kubelet alternates
    between ErrImagePull and ImagePullBackOff on every retry, and the job's message (one
    status write each) would flip with it while saying nothing new."""
    wrapped = _PULL_BACK_OFF.fullmatch(message) if reason == "ImagePullBackOff" else None
    if wrapped is None:
        return reason, message
    return wrapped["reason"], wrapped["message"]


def worded(said: str, message: str) -> str:
    """ "<said>: <message>", the message cut to MESSAGE_CHARS; `said` alone without one."""
    message = message[:MESSAGE_CHARS]
    return f"{said}: {message}" if message else said


def _worker_termination(status: dict[str, Any]) -> dict[str, Any]:
    for container in status.get("containerStatuses") or []:
        if container.get("name") == contract.WORKER_CONTAINER:
            state = container.get("state") or {}
            terminated: dict[str, Any] = state.get("terminated") or {}
            return terminated
    return {}


def _conditions(status: dict[str, Any]) -> list[PodCondition]:
    return [
        PodCondition(_text(c.get("type")), _text(c.get("status")), _text(c.get("reason")))
        for c in status.get("conditions") or []
    ]


def _text(value: Any) -> str:
    """A field as kept: "" when absent, one shared copy of each string."""
    return sys.intern(str(value)) if value else ""


def _condition_true(status: dict[str, Any], kind: str) -> bool:
    return any(
        c.get("type") == kind and c.get("status") == "True" for c in status.get("conditions") or []
    )


def _seconds(value: Any) -> int:
    """A whole number of seconds from an annotation anyone may write; 0 when unreadable."""
    try:
        return max(0, int(str(value)))
    except ValueError:
        return 0


def parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
