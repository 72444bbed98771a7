"""Reconcile one TrainingJob: read -> parse -> decide -> write.

The thin shell around the pure core. The job comes from the watch index, not a
GET per reconcile: when the index still holds the very version this reconciler
replaced with its last status write, the body that write returned is used
instead, so a decision never rests on a status older than our own (compared by
equality of resourceVersions, never by order, as the API asks). Any other stale
read is refused by the resourceVersion guard on the status write (409, retried
at once). Pods come from the watch index too (a stale pod view only delays a
decision: names are deterministic and deletes idempotent). A new attempt's status
is written first, so the attempt is recorded before any of its pods exist; workers of
an attempt already recorded are created first and one status counting them follows,
in the Job controller's order (create, then update the status). A whole new gang that
fits at once is created placed (placer.place_now), not gated and released, and the status
decided with its pods is held for HOLD_SECONDS (the pod events' batch period) rather than
written at once: by then the gang is usually bound and running, and one write says so
instead of two. The next reconcile decides from the held status and writes, whatever it
finds; a held status is dropped when the job's written status changed meanwhile.
"""

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from trainwave import contract
from trainwave.api.network import NetworkSpec
from trainwave.api.reasons import Reason
from trainwave.api.status import Phase, TrainingJobStatus
from trainwave.api.trainingjob import (
    InvalidSpec,
    JobKey,
    ObjectMeta,
    TrainingJob,
    parse_metadata,
    parse_status,
)
from trainwave.backoff import Backoff
from trainwave.builders.pods import build_worker_pods
from trainwave.builders.service import build_service
from trainwave.builders.status_key import build_status_key_secret
from trainwave.builders.workload import build_workload
from trainwave.controller import metrics
from trainwave.controller.admission_guards import AdmissionGuards
from trainwave.controller.departures import Departures
from trainwave.controller.goodput_metrics import record_goodput
from trainwave.controller.kube import Conflict, KubeClient, Refused, Rejected, transient
from trainwave.controller.placer import Placer, Ticket
from trainwave.controller.reporting import StatusPoller, Targets
from trainwave.controller.workloads import (
    WorkloadCache,
    create_workload,
    patch_workload_status,
    set_workload_active,
)
from trainwave.lifecycle.admission import (
    Admission,
    finished_conditions,
    queue_of,
    released_conditions,
    with_flavors,
)
from trainwave.lifecycle.children import creating_failed
from trainwave.lifecycle.decide import Decision, JobEvent, decide, decide_invalid
from trainwave.lifecycle.errors import reconcile_failed, reconciled
from trainwave.lifecycle.goodput import Memory
from trainwave.lifecycle.observed import NodeHealth, PodPhase, WorkerPod, observe_pod
from trainwave.lifecycle.podsecurity import explain_refusal
from trainwave.lifecycle.workload_actions import WorkloadAction
from trainwave.resolving import ResolvedJob, resolve, resolve_job
from trainwave.signatures import job_key

logger = logging.getLogger(__name__)

# A status write that lost a race is retried at once from a fresh read.
CONFLICT_RETRY_SECONDS = 0.05
# A child the API server refused is retried after 2, 4, 8... seconds, at most 300, each
# up to a tenth longer at random (a quota refuses many jobs at once).
REFUSED_BACKOFF = Backoff(base=2.0, cap=300.0, jitter=0.1)
# Pods created but not yet seen by the watch hold the job's next decision back at most
# this long (kube-controller-manager's ControllerExpectations wait 5 minutes).
EXPECTATIONS_SECONDS = 15.0
# A worker pod's event wakes its job this much later, so one reconcile sees a gang's pods
# created, bound and started together (the handlers batch them; the Job controller's
# syncJobBatchPeriod).
POD_BATCH_SECONDS = 1.0
# How long the status decided with a gang created placed is held before it is written,
# at most: until the batch of its pods' events wakes the job.
HOLD_SECONDS = POD_BATCH_SECONDS


@dataclass(frozen=True)
class Understood:
    """What a reconcile makes of the job before deciding: resolved once, and admitted."""

    resolved: ResolvedJob
    admission: Admission | None


@dataclass(frozen=True)
class Held:
    """A status decided right after a gang was created placed, not written yet."""

    uid: str
    replaced: TrainingJobStatus  # the written status it stands in for
    status: TrainingJobStatus
    # The news of the phases passed on the way to `status` ("job accepted", "0/4 workers
    # bound"): posted only if the status written next is still in that phase, since a
    # phase change no status ever showed is no news.
    events: tuple[JobEvent, ...]


@dataclass(frozen=True)
class Expected:
    """Pods this reconciler created for an attempt and the watch has not shown yet."""

    attempt: int
    names: frozenset[str]
    until: float  # time.monotonic(): decide anyway after this


class Reconciler:
    def __init__(
        self,
        kube: KubeClient,
        *,
        job_body: Callable[[JobKey], dict[str, Any] | None],
        worker_pods: Callable[[JobKey], Iterable[WorkerPod]],
        has_service: Callable[[JobKey], bool],
        placer: Placer,
        levels: tuple[str, ...],
        record_event: Callable[[dict[str, Any], JobEvent], None],
        runtime_image: str = contract.DEFAULT_RUNTIME_IMAGE,
        arbiter_dir: str | None = None,
        gpu_claims: bool = False,
        poller: StatusPoller | None = None,
        master_key: bytes = b"",
        departures: Departures | None = None,
        node_health: Callable[[str], NodeHealth | None] = lambda name: None,
        workloads: WorkloadCache | None = None,
        guards: AdmissionGuards | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ):
        self._kube = kube
        self._record_event = record_event
        self._placer = placer
        self._levels = levels
        self._runtime_image = runtime_image
        self._arbiter_dir = arbiter_dir
        self._gpu_claims = gpu_claims
        self._poller = poller
        self._master_key = master_key  # each job's status key is derived from it
        self._job_body = job_body
        # Per job: (the resourceVersion our last status write replaced, the body it returned).
        self._written: dict[JobKey, tuple[str, dict[str, Any]]] = {}
        self._worker_pods = worker_pods
        self._has_service = has_service
        self._clock = clock
        self._refusals: dict[JobKey, int] = {}  # children refused in a row, per job
        self._expected: dict[JobKey, Expected] = {}
        self._held: dict[JobKey, Held] = {}
        # What the goodput decisions remember of each job's reports between polls.
        self._memories: dict[JobKey, Memory] = {}
        # Services applied and not seen by the watch yet: until when (time.monotonic()) the
        # next decisions count them as there, so they are not applied again meanwhile.
        self._services_applied: dict[JobKey, float] = {}
        # Not `departures or ...`: an empty Departures is falsy (it has a length), and the
        # reconciler would then read a private one the job cache never records into.
        self._departures = departures if departures is not None else Departures()
        self._node_health = node_health
        self._workloads = workloads  # None: Kueue integration off, queue labels ignored
        self._guards = guards  # None: every gang is created behind the gate

    async def __call__(self, key: Any) -> float | None:
        started = time.perf_counter()
        try:
            return await self.reconcile(key)
        except Exception as error:
            metrics.RECONCILE_ERRORS.inc()
            if not transient(error):
                await self._unexpected(key, error)
            raise  # the work queue logs it and retries with backoff
        finally:
            metrics.RECONCILE_SECONDS.observe(time.perf_counter() - started)

    async def _unexpected(self, key: JobKey, error: Exception) -> None:
        """An error no decision foresaw: a ReconcileError condition and an Event on the job,
        so it never sits in a retry loop without a visible reason. Best effort: if the
        job cannot be written either, the log still has it."""
        body = self._fresher(key, self._job_body(key))
        if body is None or body["metadata"].get("deletionTimestamp"):
            return
        meta = parse_metadata(body)
        failed = reconcile_failed(
            meta, parse_status(body), f"{type(error).__name__}: {error}", self._clock()
        )
        try:
            body = await self._write_status(body, meta, failed)
            await self._act(body, meta, failed, None)
        except Exception as writing:
            logger.warning("%s/%s: could not record the error: %s", *key, writing)

    async def reconcile(self, key: JobKey) -> float | None:
        body = self._fresher(key, self._job_body(key))
        if body is None or body["metadata"].get("deletionTimestamp"):
            self._forget(key)
            return None  # garbage collection removes the children
        meta = parse_metadata(body)
        written = parse_status(body)
        held = self._held_for(key, meta, written)
        base, base_status = (
            (body, written) if held is None else (_with_status_body(body, held.status), held.status)
        )
        pods = self._pods(key, base_status.attempt)
        unseen = self._unseen(key, pods)
        if unseen is not None:
            if held is not None:  # the watch is late with the pods: write what was held
                return await self._write_held(key, body, meta, held, unseen)
            return unseen
        decision, understood = self._decide(key, base, meta, pods)
        resolved = understood.resolved if understood is not None else None
        decision = _with_held_news(decision, held)
        if understood is not None and _only_creates(decision, base_status):
            # The Job controller's order when the attempt is already written: create the
            # workers, then write one status that counts them. Writing "0/N created" first
            # cost a status patch per job and said nothing a user acts on.
            accepted = decision.events  # "job accepted": the next decision starts after it
            # The pods carry this decision's status, and the next decision starts from it
            # (start times, the Created condition), now with the workers created.
            understood = replace(
                understood, resolved=_with_status(understood.resolved, decision.status)
            )
            try:
                created = await self._create_workers(meta, decision, understood.resolved)
            except (Refused, Rejected) as refused:
                self._placer.withdraw(key)
                self._record_events(body, accepted)
                return await self._not_created(
                    key, body, meta, decision, refused, resolved=resolved, pods=pods
                )
            resolved = understood.resolved
            pods = pods + created
            decision = self._decide_understood(key, understood, pods)
            if _may_hold(decision, created, resolved.job.spec.workers):
                held = Held(meta.uid, written, decision.status, accepted + decision.events)
                return self._hold(key, held, decision.requeue_after)
            self._record_events(body, accepted)
        if decision.wants_placement and resolved is not None:
            self._placer.submit(key, self._ticket(resolved, decision))
        else:
            self._placer.withdraw(key)
        self._track_workers(key, resolved.job if resolved else None, decision, pods)
        try:
            body = await self._write_status(body, meta, decision)
        except Conflict as conflict:
            logger.debug("%s/%s: %s; retrying", *key, conflict)
            return CONFLICT_RETRY_SECONDS
        self._held.pop(key, None)  # written, or equal to what is written
        # Only once the new attempt is written: a lost write is decided again from the
        # same evidence.
        self._departures.keep_only(key, decision.status.attempt)
        try:
            await self._act(body, meta, decision, resolved)
        except Conflict as conflict:  # our Workload changed under a write: decide again
            logger.debug("%s/%s: %s; retrying", *key, conflict)
            return CONFLICT_RETRY_SECONDS
        except (Refused, Rejected) as refused:
            return await self._not_created(
                key, body, meta, decision, refused, resolved=resolved, pods=pods
            )
        self._refusals.pop(key, None)
        recovered = reconciled(meta, parse_status(body), self._clock())
        if recovered is not None:
            body = await self._write_status(body, parse_metadata(body), recovered)
            await self._act(body, meta, recovered, None)
        return decision.requeue_after

    async def _not_created(
        self,
        key: JobKey,
        body: dict[str, Any],
        meta: ObjectMeta,
        decision: Decision,
        error: Refused | Rejected,
        *,
        resolved: ResolvedJob | None,
        pods: list[WorkerPod],
    ) -> float | None:
        if isinstance(error, Refused):
            network = resolved.job.spec.network if resolved else None
            return await self._refused(key, body, meta, decision, error, network=network)
        # The API server refused a pod the schema let through: the spec cannot run as
        # written. Say so on the job; nothing else to do.
        invalid = decide_invalid(
            meta, decision.status, pods, f"pod rejected: {error}", self._clock()
        )
        body = await self._write_status(body, parse_metadata(body), invalid)
        await self._act(body, meta, invalid, None)
        return decision.requeue_after

    async def _refused(
        self,
        key: JobKey,
        body: dict[str, Any],
        meta: ObjectMeta,
        decision: Decision,
        refused: Refused,
        *,
        network: NetworkSpec | None,
    ) -> float:
        """A child the API server refused (quota, forbidden, a webhook): a condition, an
        Event and a retry with backoff, never a silent endless retry. A Pod Security
        refusal also says which of the job's features needs which level."""
        explanation = explain_refusal(refused.message, network)
        failed = creating_failed(
            meta,
            decision.status,
            refused.what,
            refused.message,
            self._clock(),
            explanation=explanation,
        )
        try:
            body = await self._write_status(body, parse_metadata(body), failed)
            await self._act(body, meta, failed, None)
        except Conflict:
            return CONFLICT_RETRY_SECONDS
        count = self._refusals[key] = self._refusals.get(key, 0) + 1
        metrics.RECONCILE_ERRORS.inc()
        logger.warning("%s/%s: %s", meta.namespace, meta.name, failed.status.message)
        return REFUSED_BACKOFF.delay(count)

    def _hold(self, key: JobKey, held: Held, requeue_after: float | None) -> float:
        """Keep `held` unwritten until the next reconcile: HOLD_SECONDS away, or sooner
        if its decision asked to be looked at again sooner."""
        self._placer.withdraw(key)
        self._held[key] = held
        return min(HOLD_SECONDS, requeue_after or HOLD_SECONDS)

    async def _write_held(
        self, key: JobKey, body: dict[str, Any], meta: ObjectMeta, held: Held, then: float
    ) -> float:
        """Write a held status as it was decided, with its news; reconcile again in `then`."""
        try:
            body = await self._write_status(body, meta, Decision(held.status, events=held.events))
        except Conflict as conflict:
            logger.debug("%s/%s: %s; retrying", *key, conflict)
            return CONFLICT_RETRY_SECONDS
        self._held.pop(key, None)
        self._record_events(body, held.events)
        return then

    def _record_events(self, body: dict[str, Any], events: Iterable[JobEvent]) -> None:
        for event in events:
            self._record_event(body, event)  # posted in the background, in order

    def _forget(self, key: JobKey) -> None:
        """The job is gone or going: drop everything kept about it."""
        self._placer.withdraw(key)
        self._departures.forget(key)
        self._expected.pop(key, None)
        self._services_applied.pop(key, None)
        self._held.pop(key, None)
        self._memories.pop(key, None)
        if self._poller:
            self._poller.forget(key)

    def _held_for(self, key: JobKey, meta: ObjectMeta, written: TrainingJobStatus) -> Held | None:
        """The status held for the job, while the written one is still the one it stands in
        for (a status written meanwhile, by an error report say, is newer) and the job is the
        same object."""
        held = self._held.get(key)
        if held is None:
            return None
        if held.uid != meta.uid or held.replaced != written:
            del self._held[key]
            return None
        return held

    def _unseen(self, key: JobKey, pods: list[WorkerPod]) -> float | None:
        """Seconds to wait while pods this reconciler created are not in the watch cache yet;
        None to decide now. Deciding before the watch shows them would apply them again
        and write a status that counts them missing; their ADDED events wake the job.
        Mirrors ControllerExpectations (pkg/controller/controller_utils.go), with a
        shorter expiry: a decision is held back 15 s at most."""
        expected = self._expected.get(key)
        if expected is None:
            return None
        left = expected.until - time.monotonic()
        seen = {p.name for p in pods if p.attempt == expected.attempt}
        if left <= 0 or expected.names <= seen:
            del self._expected[key]
            return None
        return left

    def _pods(self, key: JobKey, attempt: int) -> list[WorkerPod]:
        """The index's pods, plus those of the current attempt seen leaving unfinished
        that the index has already dropped (departures.py says why)."""
        pods = list(self._worker_pods(key))
        names = {p.name for p in pods}
        return pods + [p for p in self._departures.of(key, attempt) if p.name not in names]

    def _nodes(self, pods: list[WorkerPod], attempt: int) -> dict[str, NodeHealth]:
        names = {p.node for p in pods if p.node and p.attempt == attempt}
        found = {name: self._node_health(name) for name in names}
        return {name: health for name, health in found.items() if health is not None}

    def _decide(
        self, key: JobKey, body: dict[str, Any], meta: ObjectMeta, pods: list[WorkerPod]
    ) -> tuple[Decision, Understood | None]:
        try:
            understood = self._understand(key, body)
        except InvalidSpec as invalid:
            status = parse_status(body)
            return decide_invalid(meta, status, pods, str(invalid), self._clock()), None
        return self._decide_understood(key, understood, pods), understood

    def _understand(self, key: JobKey, body: dict[str, Any]) -> Understood:
        """The job resolved (the one parse of this reconcile) and its Kueue admission."""
        resolved = resolve(
            body, self._levels, arbiter_dir=self._arbiter_dir, gpu_claims=self._gpu_claims
        )
        admission = self._admission(key, resolved.job)
        workload = admission.workload if admission is not None else None
        if admission is not None and workload is not None and workload.admitted:
            flavors = self._workloads.flavors(workload.flavors) if self._workloads else []
            if flavors is None:  # not in our cache yet: its watch event is due
                admission = replace(admission, flavors_missing=workload.flavors)
            else:
                resolved = resolve_job(
                    with_flavors(resolved.job, flavors),
                    self._levels,
                    arbiter_dir=self._arbiter_dir,
                    gpu_claims=self._gpu_claims,
                )
        return Understood(resolved, admission)

    def _decide_understood(
        self, key: JobKey, understood: Understood, pods: list[WorkerPod]
    ) -> Decision:
        resolved = understood.resolved
        attempt = resolved.job.status.attempt
        reports = self._poller.reports(key, attempt) if self._poller else {}
        nodes = self._nodes(pods, attempt)
        waiting = self._placer.waiting(key)
        decision = decide(
            resolved,
            pods,
            self._clock(),
            waiting,
            reports,
            nodes=nodes,
            admission=understood.admission,
            service_exists=self._service_exists(key),
            memory=self._memories.get(key),
        )
        # Kept whether or not the status is written: what it counts is only ever what is
        # new in the reports, so deciding again from it counts nothing twice.
        if decision.memory is None:
            self._memories.pop(key, None)
        else:
            self._memories[key] = decision.memory
        return decision

    def _service_exists(self, key: JobKey) -> bool:
        """The watch shows the job's Service, or this reconciler applied it less than
        EXPECTATIONS_SECONDS ago (ControllerExpectations again: without it, each reconcile
        between the apply and its watch event applied the Service once more). A Service
        deleted later is gone from the watch and applied again."""
        if self._has_service(key):
            self._services_applied.pop(key, None)
            return True
        until = self._services_applied.get(key)
        if until is None:
            return False
        if until > time.monotonic():
            return True
        del self._services_applied[key]
        return False

    def _admission(self, key: JobKey, job: TrainingJob) -> Admission | None:
        """A job with a queue-name label, when the Kueue integration is on."""
        queue = queue_of(job)
        if self._workloads is None or not queue:
            return None
        return Admission(queue, self._workloads.workload(key, job.metadata.uid))

    def _track_workers(
        self, key: JobKey, job: TrainingJob | None, decision: Decision, pods: list[WorkerPod]
    ) -> None:
        """Poll the runtime of a running gang that has one; forget every other."""
        if self._poller is None:
            return
        runtime = job.spec.runtime if job is not None else None
        phase = decision.status.phase
        if (
            job is None
            or runtime is None
            or not runtime.enabled
            or phase not in (Phase.STARTING, Phase.RUNNING)
        ):
            self._poller.forget(key)
            return
        attempt = decision.status.attempt
        workers = {
            p.rank: (p.pod_ip, runtime.status_port)
            for p in pods
            if p.attempt == attempt and p.pod_ip and p.phase == PodPhase.RUNNING
        }
        meta = job.metadata
        status_key = job_key(self._master_key, meta.namespace, meta.name, meta.uid)
        self._poller.track(key, Targets(attempt, workers, status_key))

    def _ticket(self, resolved: ResolvedJob, decision: Decision) -> Ticket:
        job, shared = resolved.job, resolved.shared
        created = job.metadata.creationTimestamp
        return Ticket(
            attempt=decision.status.attempt,
            request=resolved.gang,
            priority=job.spec.placement.priority,
            arrival=created.timestamp() if created else 0.0,
            network=job.spec.network,
            shared_how=shared.how if shared else "",
            spread_wait=job.spec.placement.preferred_level_wait_seconds,
        )

    def _fresher(self, key: JobKey, body: dict[str, Any] | None) -> dict[str, Any] | None:
        """The watched body, or the one our last status write returned if the watch has not
        caught up with that write yet."""
        written = self._written.get(key)
        if body is None or written is None:
            self._written.pop(key, None)
            return body
        replaced, returned = written
        if body["metadata"].get("resourceVersion") == replaced:
            return returned
        self._written.pop(key, None)  # the watch has moved past it
        return body

    async def _write_status(
        self, body: dict[str, Any], meta: ObjectMeta, decision: Decision
    ) -> dict[str, Any]:
        old = parse_status(body)
        if decision.status == old:
            return body
        status = decision.status.model_dump(by_alias=True, mode="json")
        updated = await asyncio.to_thread(
            self._kube.patch_job_status, meta.namespace, meta.name, meta.resourceVersion, status
        )
        self._written[(meta.namespace, meta.name)] = (meta.resourceVersion, updated)
        self._record(meta, old, decision)
        return updated

    def _record(self, meta: ObjectMeta, old: TrainingJobStatus, decision: Decision) -> None:
        new = decision.status
        if new.phase != old.phase and new.phase is not None:
            metrics.PHASE_TRANSITIONS.labels(new.phase.value).inc()
            logger.info(
                "%s/%s: %s -> %s (%s) %s",
                meta.namespace,
                meta.name,
                old.phase,
                new.phase.value,
                new.reason,
                new.message,
            )
        # Each restart moves exactly one of the status counters by cause.
        for cause, before, after in (
            ("hang" if new.reason == Reason.HUNG else "failure", old.restarts, new.restarts),
            (
                _DISRUPTION_CAUSES.get(new.reason, "disruption"),
                old.disruptions,
                new.disruptions,
            ),
            ("ignored", old.ignored_restarts, new.ignored_restarts),
            ("preemption", old.preemptions, new.preemptions),
        ):
            if after > before:
                metrics.GANG_RESTARTS.labels(cause).inc(after - before)
        if decision.all_running_after is not None:
            metrics.ALL_RUNNING_SECONDS.observe(decision.all_running_after)
        record_goodput(old, decision)

    async def _create_workers(
        self, meta: ObjectMeta, decision: Decision, resolved: ResolvedJob
    ) -> list[WorkerPod]:
        """Apply the pods of `decision.create_ranks` for `resolved`, whose job carries the
        decided status (attempt, last preemption), placed already when the placer finds a
        new gang room at once (`_place_at_creation`), else behind the gate; the workers they
        are, as the watch will show them once it catches up."""
        kube = self._kube
        job = resolved.job
        runtime = job.spec.runtime
        if self._poller is not None and runtime is not None and runtime.enabled:
            # Before the pods, which mount it: the key they sign their status with.
            status_key = job_key(self._master_key, meta.namespace, meta.name, meta.uid)
            secret = build_status_key_secret(job.metadata, status_key)
            await asyncio.to_thread(kube.create_secret, secret)
        pods = build_worker_pods(
            resolved, decision.create_ranks, decision.status.attempt, self._runtime_image
        )
        placed = await self._place_at_creation(meta, decision, resolved, pods)
        results = await asyncio.gather(
            *(asyncio.to_thread(kube.apply_pod, pod) for pod in placed or pods),
            return_exceptions=True,
        )
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            if placed:  # a refused pod holds nothing; the created ones are placed already
                for pod, result in zip(placed, results, strict=True):
                    if isinstance(result, BaseException):
                        self._placer.forget_unborn(meta.namespace, pod["metadata"]["name"])
            raise failed[0]
        if placed:
            metrics.GANGS_PLACED.inc()
            metrics.GANGS_PLACED_AT_CREATION.inc()
            pods = placed
        self._expected[(meta.namespace, meta.name)] = Expected(
            decision.status.attempt,
            frozenset(pod["metadata"]["name"] for pod in pods),
            time.monotonic() + EXPECTATIONS_SECONDS,
        )
        workers = (observe_pod(pod) for pod in pods)
        return [worker for worker in workers if worker is not None]

    async def _place_at_creation(
        self,
        meta: ObjectMeta,
        decision: Decision,
        resolved: ResolvedJob,
        pods: list[dict[str, Any]],
    ) -> list[dict[str, Any]] | None:
        """The gang's pods pinned and ungated when the placer finds it room before they
        exist (placer.place_now); None: they are created behind the gate. Only a whole new
        gang of whole GPUs (or none) outside Kueue, only where nothing can change or refuse
        a pod on the way in (admission_guards.py)."""
        job = resolved.job
        if (
            self._guards is None
            or len(decision.create_ranks) != job.spec.workers
            or resolved.shared is not None
            or (self._workloads is not None and queue_of(job))
            or any(pod["spec"].get("runtimeClassName") for pod in pods)
            or self._guards.blocker(meta.namespace)
        ):
            return None
        ticket = self._ticket(resolved, decision)
        return await self._placer.place_now((meta.namespace, meta.name), ticket, pods)

    async def _workload(self, meta: ObjectMeta, decision: Decision, resolved: ResolvedJob) -> None:
        """Create, release, finish, (de)activate the job's Workload, as lifecycle/admission.py
        decided."""
        job = resolved.job
        key = (meta.namespace, meta.name)
        action = decision.workload
        workloads = self._workloads
        if workloads is None:  # Kueue integration off: decide asks for no Workload action
            return
        version = workloads.version  # the one kueue_api.py discovered
        if action == WorkloadAction.CREATE:
            body = build_workload(resolved, queue_of(job), self._runtime_image)
            await asyncio.to_thread(create_workload, self._kube, body, version=version)
            return
        workload = workloads.workload(key, meta.uid)
        if workload is None:
            return
        if action in (WorkloadAction.ACTIVATE, WorkloadAction.DEACTIVATE):
            active = action == WorkloadAction.ACTIVATE
            await asyncio.to_thread(
                set_workload_active,
                self._kube,
                meta.namespace,
                workload.name,
                active,
                version=version,
            )
            return
        now = self._clock()
        if action == WorkloadAction.RELEASE:
            status: dict[str, Any] = {
                "admission": None,
                "conditions": released_conditions(workload, now),
            }
        else:
            succeeded = decision.status.phase == Phase.SUCCEEDED
            message = decision.status.message or str(decision.status.phase)
            status = {"conditions": finished_conditions(workload, succeeded, message, now)}
        await asyncio.to_thread(
            patch_workload_status,
            self._kube,
            meta.namespace,
            workload.name,
            workload.resource_version,
            status,
            version=version,
        )

    async def _act(
        self,
        body: dict[str, Any],
        meta: ObjectMeta,
        decision: Decision,
        resolved: ResolvedJob | None,
    ) -> None:
        """Carry out `decision`; `job` is the spec parsed once by `_decide` (None: invalid)."""
        kube = self._kube
        self._record_events(body, decision.events)
        await self._mark_nodes(decision)
        if decision.workload != WorkloadAction.NONE and resolved is not None:
            await self._workload(meta, decision, resolved)
        await asyncio.gather(
            *(asyncio.to_thread(kube.delete_pod, meta.namespace, n) for n in decision.delete_pods)
        )
        if decision.create_ranks and resolved is not None:
            await self._create_workers(meta, decision, _with_status(resolved, decision.status))
        if resolved is not None and decision.wants_service:
            await asyncio.to_thread(kube.apply_service, build_service(resolved.job))
            self._services_applied[(meta.namespace, meta.name)] = (
                time.monotonic() + EXPECTATIONS_SECONDS
            )
        if decision.delete_job:
            logger.info(
                "%s/%s: ttlSecondsAfterFinished passed; deleting", meta.namespace, meta.name
            )
            await asyncio.to_thread(kube.delete_job, meta.namespace, meta.name, meta.uid)

    async def _mark_nodes(self, decision: Decision) -> None:
        """Annotate the nodes of replaced stragglers; best effort: the placer keeps the new
        gang off them in any case, the annotation tells people and other replicas."""
        for node, until in decision.mark_nodes:
            self._placer.mark_node(node, until)
            stamp = until.isoformat().replace("+00:00", "Z")
            try:
                await asyncio.to_thread(
                    self._kube.annotate_node, node, {contract.ANNOTATION_STRAGGLER_UNTIL: stamp}
                )
            except Exception as error:  # RBAC of an older chart, the API server away
                logger.warning("node %s: could not mark it slow until %s: %s", node, stamp, error)


# The disruptions that goodput decisions cause, by the reason they restart the gang with.
_DISRUPTION_CAUSES: dict[str, str] = {
    Reason.STRAGGLER_REPLACED: "straggler",
    Reason.PREFLIGHT_FAILED: "preflight",
}


def _only_creates(decision: Decision, written: TrainingJobStatus) -> bool:
    """A decision that creates workers of the attempt the job's status already records and
    does nothing else: the status may follow the pods. A new attempt is written first, so a
    lost write is decided again from the same evidence."""
    return (
        bool(decision.create_ranks)
        and decision.status.attempt == written.attempt
        and not decision.delete_pods
        and decision.workload == WorkloadAction.NONE
        and not decision.delete_job
    )


def _may_hold(decision: Decision, created: list[WorkerPod], workers: int) -> bool:
    """Whether the status decided after creating `created` may wait: a whole gang created
    placed (none of it gated) and nothing to do but write the status and post its news."""
    return (
        len(created) == workers
        and not any(worker.gated for worker in created)
        and not decision.create_ranks
        and not decision.delete_pods
        and not decision.wants_placement
        and not decision.wants_service
        and decision.workload == WorkloadAction.NONE
        and not decision.delete_job
        and decision.status.phase is not None
        and not decision.status.phase.terminal
    )


def _with_held_news(decision: Decision, held: Held | None) -> Decision:
    """`decision` with the held status's news first, while it is still the news it was (the
    status to be written is in the held phase); otherwise only its lasting news (a warning
    about the spec, which the phase written next does not make stale)."""
    if held is None:
        return decision
    news = held.events
    if decision.status.phase != held.status.phase:
        news = tuple(event for event in held.events if event.lasting)
    return replace(decision, events=news + decision.events) if news else decision


def _with_status_body(body: dict[str, Any], status: TrainingJobStatus) -> dict[str, Any]:
    """`body` with `status` in place of the written one, for deciding from a held status."""
    return {**body, "status": status.model_dump(by_alias=True, mode="json")}


def _with_status(resolved: ResolvedJob, status: TrainingJobStatus) -> ResolvedJob:
    return replace(resolved, job=resolved.job.model_copy(update={"status": status}))
