"""The failure policy: what a worker in trouble does to its gang.

Pure. `find_incidents` turns what is observed of the current attempt (its pods,
their nodes) into incidents: a worker that failed, was marked for disruption,
sits on a lost or long-NotReady node, or vanished. `judge_failure` tries the
rules in order on the incident that happened first (later ones often just lost
a peer); the first match decides. With no match, a disruption restarts the
gang under its own budget (maxDisruptions) and anything else restarts it
counted toward maxRestarts, because NCCL ranks cannot carry on without a peer.

This mirrors Job `podFailurePolicy` (k8s.io/kubernetes pkg/controller/job/
pod_failure_policy.go): rules in order, first match wins, `onExitCodes` skips
nothing but 0, `onPodConditions` needs type and status equal. What differs:
trainwave acts on a DisruptionTarget=True pod before it is terminal and on its
node's state, because a pod on an unreachable node stays Terminating with phase
Running until the Node is deleted or the kubelet returns, and a gang cannot wait.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from trainwave.api.run_policy import FailureAction, FailurePolicy, FailureRule
from trainwave.lifecycle.observed import NodeHealth, PodCondition, PodPhase, WorkerPod

# trainwave's words for node trouble, matched by `onReasons` like a pod's own reasons.
NODE_LOST = "NodeLost"  # the Node object is gone (the legacy node controller's pod reason)
NODE_NOT_READY = "NodeNotReady"  # NotReady or Unknown for longer than the grace

# Pod status reasons that say the pod was taken, not that it failed:
# Evicted (kubelet node-pressure eviction, pkg/kubelet/eviction), Terminated and
# Shutdown (graceful node shutdown, pkg/kubelet/nodeshutdown), NodeLost (legacy
# node controller), and the kubelet's admission refusals after binding
# (pkg/kubelet/lifecycle/predicate.go: OutOf<resource>, NodeAffinity,
# UnexpectedAdmissionError): a placement race, not the job's fault.
_DISRUPTION_REASONS = frozenset(
    {"Evicted", "Terminated", "Shutdown", NODE_LOST, "NodeAffinity", "UnexpectedAdmissionError"}
)


class Cause(StrEnum):
    """Why the gang restarts; each cause has its own budget and status counter."""

    FAILURE = "Failure"  # status.restarts, maxRestarts
    DISRUPTION = "Disruption"  # status.disruptions, maxDisruptions
    IGNORED = "Ignored"  # status.ignoredRestarts, maxIgnoredRestarts, with backoff
    # Still hung a full hangTimeoutSeconds after the Hung condition (lifecycle/goodput.py):
    # the job's own processes stall, so it spends status.restarts and maxRestarts.
    HANG = "Hang"
    # A straggler replaced (runPolicy.stragglers.replace): the node's fault, not the job's,
    # so it spends status.disruptions and maxDisruptions.
    STRAGGLER = "Straggler"
    # A node below runPolicy.preflight's floor: re-placed like a straggler, as a disruption.
    PREFLIGHT = "Preflight"


@dataclass(frozen=True)
class Incident:
    """One worker of the current attempt in trouble, and what is known of why."""

    rank: int
    name: str
    what: str  # for people: "exited with code 137 (OOMKilled)"
    exit_code: int | None = None
    reasons: tuple[str, ...] = ()  # container, pod and node reasons, for onReasons
    conditions: tuple[PodCondition, ...] = ()  # for onPodConditions
    disruption: str = ""  # why this counts as a disruption by default; "" if it does not
    at: datetime | None = None
    # Deleted or vanished unfinished: taken from the job rather than failed by it (a worker
    # may be replaced alone, lifecycle/replacing.py), though counted as a failure by default.
    taken: bool = False

    def describe(self) -> str:
        named = f" ({self.name})" if self.name else ""
        return f"worker {self.rank}{named} {self.what}"


@dataclass(frozen=True)
class Incidents:
    found: list[Incident]
    recheck_after: float | None = None  # seconds until a NotReady node's grace runs out


@dataclass(frozen=True)
class FailureVerdict:
    action: FailureAction
    cause: Cause  # meaningless for FailJob
    rule_index: int | None
    incident: Incident

    def describe(self) -> str:
        rule = (
            f" (failurePolicy.rules[{self.rule_index}]: {self.action})"
            if self.rule_index is not None
            else ""
        )
        return f"{self.incident.describe()}{rule}"


def find_incidents(
    current: Sequence[WorkerPod],
    workers: int,
    nodes: Mapping[str, NodeHealth],
    now: datetime,
    grace_seconds: float,
    *,
    gang_formed: bool,
    replacing: frozenset[int] = frozenset(),
) -> Incidents:
    """`current`: pods of the current attempt (a pod seen deleted is kept, marked deleting).
    `nodes`: health of the nodes the caller knows; a node not in it is not judged.
    `gang_formed`: every worker existed once, so a missing one was taken. `replacing`:
    workers being replaced alone, whose missing pod is expected (lifecycle/replacing.py)."""
    found: list[Incident] = []
    waits: list[float] = []
    for pod in current:
        node = _node_word(pod, nodes, now, grace_seconds, waits)
        if pod.phase == PodPhase.FAILED and not pod.ended_by_deletion:
            found.append(_failed(pod, node))
        elif pod.phase == PodPhase.SUCCEEDED or not gang_formed:
            continue
        elif pod.disruption:
            what = f"was disrupted ({pod_disruption(pod)})"
            found.append(_incident(pod, what, node, disruption=pod_disruption(pod)))
        elif node:
            what = f"lost its node {pod.node} ({node})"
            found.append(_incident(pod, what, node, disruption=node))
        elif pod.deleting:
            found.append(_incident(pod, "was deleted before it finished", "", taken=True))
    if gang_formed:
        seen = {p.rank for p in current} | replacing
        found.extend(
            Incident(rank, "", "vanished before it finished", taken=True)
            for rank in range(workers) if rank not in seen
        )  # fmt: skip
    return Incidents(found, min(waits) if waits else None)


def pod_disruption(pod: WorkerPod) -> str:
    return f"DisruptionTarget: {pod.disruption}"


def judge_failure(policy: FailurePolicy, incidents: Sequence[Incident]) -> FailureVerdict:
    first = first_incident(incidents)
    for index, rule in enumerate(policy.rules):
        if _matches(rule, first):
            cause = Cause.IGNORED if rule.action == "Ignore" else Cause.FAILURE
            return FailureVerdict(rule.action, cause, index, first)
    cause = Cause.DISRUPTION if first.disruption else Cause.FAILURE
    return FailureVerdict("RestartGang", cause, None, first)


def first_incident(incidents: Sequence[Incident]) -> Incident:
    """The earliest: the root cause; later ones often just lost a peer."""
    return min(
        incidents,
        key=lambda i: (i.at is None, i.at.timestamp() if i.at else 0.0, i.rank),
    )


def _failed(pod: WorkerPod, node: str) -> Incident:
    # "Error" is what every non-zero exit says; only a telling reason (OOMKilled) is shown.
    reasons = ", ".join(r for r in (pod.container_reason, pod.pod_reason) if r and r != "Error")
    if pod.exit_code is not None:
        what = f"exited with code {pod.exit_code}" + (f" ({reasons})" if reasons else "")
    else:
        what = f"failed ({reasons or 'no exit code'})"
    disruption = (
        (pod.disruption and pod_disruption(pod))
        or (pod.pod_reason if _disruptive(pod.pod_reason) else "")
        or node
    )
    return _incident(pod, what, node, disruption=disruption)


def _incident(
    pod: WorkerPod, what: str, node: str, *, disruption: str = "", taken: bool = False
) -> Incident:
    reasons = tuple(r for r in (pod.container_reason, pod.pod_reason, node) if r)
    return Incident(
        rank=pod.rank,
        name=pod.name,
        what=what,
        exit_code=pod.exit_code,
        reasons=reasons,
        conditions=pod.conditions,
        disruption=disruption,
        at=pod.finished_at,
        taken=taken,
    )


def _node_word(
    pod: WorkerPod,
    nodes: Mapping[str, NodeHealth],
    now: datetime,
    grace: float,
    waits: list[float],
) -> str:
    """NODE_LOST, NODE_NOT_READY past the grace, or ""; a grace still running is noted
    in `waits` so the caller looks again when it ends."""
    health = nodes.get(pod.node) if pod.node and not pod.finished else None
    if health is None:
        return ""
    if not health.present:
        return NODE_LOST
    if health.ready:
        return ""
    since = health.not_ready_since or now
    remaining = grace - (now - since).total_seconds()
    if remaining <= 0:
        return NODE_NOT_READY
    waits.append(remaining)
    return ""


def _disruptive(reason: str) -> bool:
    return reason in _DISRUPTION_REASONS or reason.startswith("OutOf")


def _matches(rule: FailureRule, incident: Incident) -> bool:
    if rule.on_exit_codes is not None:
        # A pod that ended without a container exit code (evicted, lost node) is
        # matched by no exit-code rule.
        if incident.exit_code is None:
            return False
        listed = incident.exit_code in rule.on_exit_codes.values
        return listed if rule.on_exit_codes.operator == "In" else not listed
    if rule.on_reasons is not None:
        return any(reason in rule.on_reasons for reason in incident.reasons)
    return any(
        c.type == m.type and c.status == m.status and (not m.reasons or c.reason in m.reasons)
        for m in rule.on_pod_conditions or ()
        for c in incident.conditions
    )
