"""Replace one worker, not the gang: a lost worker recreated alone (runPolicy.workerReplacement).

Pure. With the runtime's in-place restarts on, every worker runs under torch's elastic
agent and c10d rendezvous (builders/runtime.py `in_place_env`): when one worker's pod
is lost, the other workers' agents see their peer fail, restart their processes into a
new rendezvous round and wait there for the missing node (torch's join timeout, 600 s
by default). So the gang need not be recreated: the lost worker alone gets a new pod of
the same attempt and rank (so the same hostname, DNS name and `PET_LOCAL_ADDR`), named
with the replacement's serial (`<job>-a<attempt>-worker-<rank>-r<serial>`), placed by the
placer in the gang's topology domain where there is room; the healthy workers keep their
pods.

`judge_replacement` says whether a trouble may be repaired so, and if not, why the gang
is recreated instead. Replacement when all of these hold:
- the runtime is on with `spec.runtime.inPlaceRestarts` > 0 and
  `runPolicy.workerReplacement.enabled` (the default);
- every worker in trouble was taken, not failed: a disruption (node lost or NotReady,
  drain or eviction, DisruptionTarget), a pod deleted or vanished, or a straggler the
  policy replaces; a process that failed past torchrun's restarts is the job's own
  failure and the failure policy judges it as before;
- no failurePolicy rule matches (the user's rules decide what they name);
- worker 0 may be among them: it hosts the rendezvous store at the master address, so
  the other agents lose the store with it and end; their launchers start them again, and
  they meet the new worker 0's fresh store under the same name (runtime/launcher/rejoin.py);
- at most half the gang (at least one worker, and never all of it: a gang of one worker
  is recreated as a new attempt): beyond that a new gang costs no more;
- the attempt's in-place restarts plus its replacements stay within inPlaceRestarts;
- maxDisruptions is not spent (then the gang path fails the job as before).

A replacement is written into the status first (`status.replacements.pending`, with the
old pod's UID and the serial), then the old pod is deleted: force-deleted when its node is
lost or NotReady (no kubelet will confirm a graceful delete). The new pod has a name of its
own, so it is created in the next reconcile, while the old one may still terminate (a pod
keeps its name in the API until its kubelet confirms the end, seconds after an eviction);
the old pod's resources count on its node until it is gone, as kube-scheduler counts them.
An entry an earlier operator wrote has no serial: its new pod reuses the old name and is
created once the old pod is gone. A worker's pods with a lower serial than its newest are
`superseded`: neither trouble nor workers of the gang. `follow_replacements` finishes each
replacement when its new pod runs (a Warning Event names the worker, the old node and the
new one) and gives up after `timeoutSeconds`: the gang is recreated.
"""

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from trainwave.api.reasons import Reason
from trainwave.api.status import (
    ConditionType,
    PendingReplacement,
    Phase,
    ReplacementStatus,
    TrainingJobStatus,
)
from trainwave.api.trainingjob import TrainingJob
from trainwave.lifecycle.draft import Draft, JobEvent
from trainwave.lifecycle.failures import NODE_LOST, NODE_NOT_READY, Incident
from trainwave.lifecycle.observed import PodPhase, WorkerPod

DISRUPTION = "disruption"
STRAGGLER = "straggler"


@dataclass(frozen=True)
class ReplacementVerdict:
    """Replace `ranks` alone; with none, recreate the gang, `why_not` saying why ("" when
    replacement is off for the job: there is nothing to explain)."""

    ranks: tuple[int, ...] = ()
    why_not: str = ""


@dataclass(frozen=True)
class InFlight:
    """Replacements under way this reconcile: the ranks whose old pod is expected to go and
    whose new pod is expected to come, and those old pods' UIDs."""

    ranks: frozenset[int] = frozenset()
    old_uids: frozenset[str] = frozenset()
    overdue: str = ""  # set: a replacement ran out of time; recreate the gang with this
    # Ranks whose entry has no serial (an earlier operator's): the new pod takes the old
    # pod's name, so it waits for that pod to be gone from the API.
    reuse_names: frozenset[int] = frozenset()

    def hides(self, pod: WorkerPod) -> bool:
        """An old pod of a worker being replaced: neither an incident nor a present worker."""
        return pod.rank in self.ranks and pod.uid in self.old_uids

    def holds_name(self, pod: WorkerPod) -> bool:
        """An old pod whose name its replacement waits for."""
        return self.hides(pod) and pod.rank in self.reuse_names and not pod.departed


def superseded(pods: Iterable[WorkerPod]) -> frozenset[str]:
    """The names of pods replaced since: of each rank, those with a serial below the
    newest one's (an old pod still terminating, or its last state kept as departed)."""
    pods = list(pods)
    newest: dict[int, int] = {}
    for pod in pods:
        newest[pod.rank] = max(newest.get(pod.rank, 0), pod.serial)
    return frozenset(p.name for p in pods if p.serial < newest[p.rank])


def replacement_on(job: TrainingJob) -> bool:
    runtime = job.spec.runtime
    return (
        runtime is not None
        and runtime.enabled
        and runtime.in_place_restarts > 0
        and job.spec.run_policy.worker_replacement.enabled
    )


def in_place_used(status: TrainingJobStatus) -> int:
    """In-place restarts and replacements the current attempt has used."""
    used = 0
    counted = status.goodput.counted if status.goodput is not None else None
    if counted is not None and counted.attempt == status.attempt:
        used += counted.in_place_restarts
    replacements = status.replacements
    if replacements is not None and replacements.attempt == status.attempt:
        used += replacements.in_attempt
    return used


def judge_replacement(
    job: TrainingJob,
    status: TrainingJobStatus,
    incidents: Sequence[Incident],
    *,
    rule_matched: bool = False,
    straggler: bool = False,
) -> ReplacementVerdict:
    """Whether the workers of `incidents` may be replaced alone (module docstring)."""
    if not replacement_on(job) or not incidents:
        return ReplacementVerdict()
    failed = [i for i in incidents if not (straggler or _taken(i))]
    if failed:
        return ReplacementVerdict(
            why_not=f"worker {failed[0].rank} failed rather than was taken: the gang is recreated"
        )
    if rule_matched:
        return ReplacementVerdict(why_not="a failurePolicy rule matched: it decides")
    ranks = tuple(sorted({i.rank for i in incidents}))
    workers = job.spec.workers
    if len(ranks) >= workers:  # a gang of one: nothing would be kept, so a new attempt
        return ReplacementVerdict(
            why_not=f"every worker of the gang ({workers}) is in trouble: the gang is recreated"
        )
    most = max(1, workers // 2)
    if len(ranks) > most:
        return ReplacementVerdict(
            why_not=f"{len(ranks)} of {workers} workers lost (replaced alone: at most {most}); "
            "the gang is recreated"
        )
    bound = job.spec.runtime.in_place_restarts if job.spec.runtime is not None else 0
    used = in_place_used(status)
    if used + len(ranks) > bound:
        return ReplacementVerdict(
            why_not=f"this attempt used {used} of spec.runtime.inPlaceRestarts ({bound}) in "
            "in-place restarts and replacements; the gang is recreated"
        )
    limit = job.spec.run_policy.failure_policy.max_disruptions
    if status.disruptions >= limit:
        return ReplacementVerdict(why_not=f"maxDisruptions ({limit}) spent")
    return ReplacementVerdict(ranks)


def start_replacement(
    draft: Draft,
    job: TrainingJob,
    verdict: ReplacementVerdict,
    incidents: Sequence[Incident],
    current: Sequence[WorkerPod],
    *,
    cause: str,
) -> None:
    """Record the replacements (status first: a lost write is decided again from the same
    evidence), delete the old pods and count one disruption."""
    status = draft.status
    attempt = status.attempt
    pending = list(_pending_of(status))
    known = {p.rank for p in pending}
    what = {i.rank: i for i in incidents}
    before = status.replacements or ReplacementStatus()
    added: list[PendingReplacement] = []
    for rank in verdict.ranks:
        if rank in known:
            continue
        # The pod in the API if it is still there, else its last state (a departed pod:
        # evicted and deleted at once, its UID and node are still known).
        mine = sorted((p for p in current if p.rank == rank), key=lambda p: p.departed)
        pod = mine[0] if mine else None
        incident = what[rank]
        entry = PendingReplacement(
            rank=rank,
            pod_uid=pod.uid if pod is not None else "",
            node=pod.node if pod is not None else "",
            cause=cause,
            what=incident.describe(),
            since=draft.now,
            serial=before.total + len(added) + 1,  # total counts every attempt: unique
        )
        added.append(entry)
        if pod is None or pod.departed:
            continue
        # A drained, evicted or deleted pod is already going; a finished one (evicted:
        # Failed) holds nothing, but is deleted all the same: a worker has one pod.
        if _node_gone(incident):
            draft.force_delete.append(pod.name)  # no kubelet will confirm the end
        elif not pod.deleting:
            draft.delete.append(pod.name)
    if not added:
        return
    in_attempt = before.in_attempt if before.attempt == attempt else 0
    limit = job.spec.run_policy.failure_policy.max_disruptions
    draft.update(
        disruptions=status.disruptions + 1,
        replacements=ReplacementStatus(
            total=before.total + len(added),
            attempt=attempt,
            in_attempt=in_attempt + len(added),
            pending=pending + added,
        ),
    )
    bound = job.spec.runtime.in_place_restarts if job.spec.runtime is not None else 0
    lost = "; ".join(f"{e.what} (node {e.node or 'unknown'})" for e in added)
    stay = sorted({p.rank for p in current if p.rank not in verdict.ranks and p.active})
    message = (
        f"{lost}: replacing only {_workers(e.rank for e in added)}, the other workers "
        f"({', '.join(map(str, stay)) or 'none'}) keep their pods and re-enter rendezvous "
        f"(disruption {draft.status.disruptions} of {limit}; {in_place_used(draft.status)} of "
        f"{bound} in-place restarts and replacements of this attempt)"
    )
    draft.condition(ConditionType.WORKER_REPLACEMENT, True, Reason.REPLACING_WORKER, message)
    draft.clear(ConditionType.RUNNING, Reason.REPLACING_WORKER, message)
    if draft.status.phase == Phase.RESTARTING:
        draft.events.append(JobEvent("Warning", Reason.REPLACING_WORKER, message))
    draft.enter(Phase.RESTARTING, Reason.REPLACING_WORKER, message, warning=True)


def follow_replacements(draft: Draft, job: TrainingJob, current: Sequence[WorkerPod]) -> InFlight:
    """Finish the replacements whose new pod runs, note the ones still under way, and say
    when one ran out of `runPolicy.workerReplacement.timeoutSeconds`."""
    status = draft.status
    replacements = status.replacements
    if replacements is None or not replacements.pending:
        return InFlight()
    if replacements.attempt != status.attempt:  # a new gang: those replacements are moot
        draft.update(replacements=replacements.model_copy(update={"pending": []}))
        return InFlight()
    timeout = job.spec.run_policy.worker_replacement.timeout_seconds
    left: list[PendingReplacement] = []
    for entry in replacements.pending:
        new = next(
            (
                p
                for p in current
                if p.rank == entry.rank and p.uid != entry.pod_uid and not p.departed
                and not p.deleting and p.phase == PodPhase.RUNNING
                and (not entry.serial or p.serial == entry.serial)
            ),
            None,
        )  # fmt: skip
        if new is not None:
            took = (draft.now - entry.since).total_seconds()
            draft.events.append(
                JobEvent(
                    "Warning",
                    Reason.WORKER_REPLACED,
                    f"worker {entry.rank} replaced: node {entry.node or 'unknown'} -> "
                    f"{new.node} ({entry.cause}: {entry.what}), running {took:.0f}s after "
                    "the decision; the other workers kept their pods",
                ),
            )
            continue
        waited = (draft.now - entry.since).total_seconds()
        if waited >= timeout:
            return _overdue(draft, entry, timeout, replacements)
        draft.requeue(timeout - waited)
        left.append(entry)
    draft.update(replacements=replacements.model_copy(update={"pending": left}))
    if not left:
        draft.condition(
            ConditionType.WORKER_REPLACEMENT,
            False,
            Reason.WORKER_REPLACED,
            f"replaced {_workers(e.rank for e in replacements.pending)}; the gang runs again",
        )
    return InFlight(
        ranks=frozenset(e.rank for e in left),
        old_uids=frozenset(e.pod_uid for e in left),
        reuse_names=frozenset(e.rank for e in left if not e.serial),
    )


def _overdue(
    draft: Draft, entry: PendingReplacement, timeout: int, replacements: ReplacementStatus
) -> InFlight:
    message = (
        f"worker {entry.rank}'s replacement not running {timeout}s after it was decided "
        "(runPolicy.workerReplacement.timeoutSeconds); see the Scheduled condition for why"
    )
    draft.update(replacements=replacements.model_copy(update={"pending": []}))
    draft.condition(ConditionType.WORKER_REPLACEMENT, False, Reason.REPLACEMENT_TIMED_OUT, message)
    return InFlight(overdue=f"{message}; recreating the gang")


def _pending_of(status: TrainingJobStatus) -> list[PendingReplacement]:
    replacements = status.replacements
    if replacements is None or replacements.attempt != status.attempt:
        return []
    return list(replacements.pending)


def _taken(incident: Incident) -> bool:
    return bool(incident.disruption) or incident.taken


def _node_gone(incident: Incident) -> bool:
    return NODE_LOST in incident.reasons or NODE_NOT_READY in incident.reasons


def _workers(ranks: Iterable[int]) -> str:
    listed = sorted(ranks)
    return ("worker " if len(listed) == 1 else "workers ") + ", ".join(map(str, listed))
