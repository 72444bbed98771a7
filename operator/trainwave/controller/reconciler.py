"""Reconcile one TrainingJob: read, decide, execute.

The thin shell around the pure core. The job comes from the watch index, not a GET
per reconcile: when the index still holds the very version this reconciler replaced
with its last status write, the body that write returned is used instead
(bookkeeping.py), so a decision never rests on a status older than our own. Any other
stale read is refused by the resourceVersion guard on the status write (409, retried
at once). Pods come from the watch index too (a stale pod view only delays a decision:
names are deterministic and deletes idempotent).

One reconcile parses the body once (reading.py), resolves the job once and decides
once (lifecycle/decide.py); executing.py carries the decision out. In which order is
lifecycle/plan.py's to say: a new attempt's status is written first, so the attempt is
recorded before any of its pods exist; workers of an attempt already recorded are
created first and one status counting them follows (lifecycle/decide.py count_created
folds them in, nothing is decided again), in the Job controller's order. A whole new
gang that fits at once is created placed (placer.place_now), not gated and released, and
its status is held for HOLD_SECONDS (the pod events' batch period) rather than written
at once: by then the gang is usually bound and running, and one write says so instead of
two. The next reconcile decides from the held status and writes, whatever it finds; a
held status is dropped when the job's written status changed meanwhile.
"""

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from trainwave import contract
from trainwave.api.network import NetworkSpec
from trainwave.api.status import Phase, TrainingJobStatus
from trainwave.api.trainingjob import InvalidSpec, JobKey, TrainingJob
from trainwave.backoff import Backoff
from trainwave.controller import metrics
from trainwave.controller.admission_guards import AdmissionGuards
from trainwave.controller.api_errors import Conflict, Refused, Rejected, transient
from trainwave.controller.bookkeeping import Bookkeeping
from trainwave.controller.departures import Departures
from trainwave.controller.executing import Executor, ticket_of, with_status
from trainwave.controller.kube import KubeClient
from trainwave.controller.placer import Placer
from trainwave.controller.pod_events import PodEvents
from trainwave.controller.reading import JobRead, read_job
from trainwave.controller.reporting import StatusPoller, Targets
from trainwave.controller.workloads import WorkloadCache
from trainwave.lifecycle.admission import Admission, queue_of, with_flavors
from trainwave.lifecycle.children import creating_failed
from trainwave.lifecycle.decide import (
    Decision,
    JobEvent,
    PlacementWait,
    count_created,
    decide,
    decide_invalid,
)
from trainwave.lifecycle.endpoints import (
    ServiceState,
    addresses,
    foreign,
    host_unpublished,
    published,
    service_state,
)
from trainwave.lifecycle.errors import reconcile_failed, reconciled
from trainwave.lifecycle.observed import NodeHealth, PodPhase, WorkerPod
from trainwave.lifecycle.plan import Held, may_hold, only_creates, with_held_news
from trainwave.lifecycle.podsecurity import explain_refusal
from trainwave.resolving import ResolvedJob, resolve_job
from trainwave.signatures import job_key

logger = logging.getLogger(__name__)

# A status write that lost a race is retried at once from a fresh read.
CONFLICT_RETRY_SECONDS = 0.05
# A child the API server refused is retried after 2, 4, 8... seconds, at most 300, each
# up to a tenth longer at random (a quota refuses many jobs at once).
REFUSED_BACKOFF = Backoff(base=2.0, cap=300.0, jitter=0.1)
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
class Seen:
    """What the job's decision rests on besides the job: observed once per reconcile."""

    pods: list[WorkerPod]
    now: datetime
    waiting: PlacementWait | None
    service_exists: bool  # the EndpointSlice names exactly this attempt's live workers
    service_stale: bool  # it names another attempt's, or a worker no longer live
    host_unpublished: bool  # worker 0 has an address no slice of the attempt names yet


class Reconciler:
    def __init__(
        self,
        kube: KubeClient,
        *,
        job_body: Callable[[JobKey], dict[str, Any] | None],
        worker_pods: Callable[[JobKey], Iterable[WorkerPod]],
        service_states: Callable[[JobKey], frozenset[ServiceState]],
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
        pod_events: PodEvents | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ):
        self._placer = placer
        self._levels = levels
        self._arbiter_dir = arbiter_dir
        self._gpu_claims = gpu_claims
        self._poller = poller
        self._master_key = master_key  # each job's status key is derived from it
        self._job_body = job_body
        self._worker_pods = worker_pods
        self._service_states = service_states
        self._clock = clock
        self._books = Bookkeeping()
        # Not `departures or ...`: an empty Departures is falsy (it has a length), and the
        # reconciler would then read a private one the job cache never records into.
        self._departures = departures if departures is not None else Departures()
        self._node_health = node_health
        self._workloads = workloads  # None: Kueue integration off, queue labels ignored
        # Why a worker sits Pending on its node, from its Events: listed by its own loop
        # (handlers.py runs it). Without one, sitting workers are tracked and never read.
        self._pod_events = pod_events if pod_events is not None else PodEvents(kube.pod_events)
        self._execute = Executor(
            kube,
            self._books,
            placer=placer,
            record_event=record_event,
            runtime_image=runtime_image,
            poller=poller,
            master_key=master_key,
            workloads=workloads,
            guards=guards,
            clock=clock,
        )

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
        body = self._books.fresher(key, self._job_body(key))
        if body is None or body["metadata"].get("deletionTimestamp"):
            return
        read = read_job(body)  # read again: the failed reconcile may have written meanwhile
        message = f"{type(error).__name__}: {error}"
        failed = reconcile_failed(read.meta, read.status, message, self._clock())
        try:
            read = await self._execute.write_status(read, failed)
            await self._execute.act(read, failed, None)
        except Exception as writing:
            logger.warning("%s/%s: could not record the error: %s", *key, writing)

    async def reconcile(self, key: JobKey) -> float | None:
        body = self._books.fresher(key, self._job_body(key))
        if body is None or body["metadata"].get("deletionTimestamp"):
            self._forget(key)
            return None  # garbage collection removes the children
        read = read_job(body)  # the one parse of this reconcile
        held = self._books.held(key, read.meta.uid, read.status)
        status = read.status if held is None else held.status  # what the decision starts from
        pods = self._pods(key, status.attempt)
        # A departed pod is only evidence: its name may be created again (a replaced worker).
        unseen = self._books.unseen(key, [p for p in pods if not p.departed])
        if unseen is not None:
            if held is not None:  # the watch is late with the pods: write what was held
                return await self._write_held(key, read, held, unseen)
            return unseen
        pods = self._pod_events.observe(key, pods, status.attempt)
        seen = Seen(
            pods,
            self._clock(),
            self._placer.waiting(key),
            *self._service(key, read.meta.uid, status.attempt, pods),
        )
        understood = self._understand(key, read, status)
        if isinstance(understood, str):
            resolved = None
            decision = decide_invalid(read.meta, status, pods, understood, seen.now)
        else:
            resolved = understood.resolved
            decision = self._decide(key, understood, seen)
        decision = with_held_news(decision, held)
        if resolved is not None and only_creates(decision, status):
            return await self._create_first(key, read, decision, resolved, seen)
        return await self._execute_decision(key, read, decision, resolved, pods)

    async def _create_first(
        self, key: JobKey, read: JobRead, decision: Decision, resolved: ResolvedJob, seen: Seen
    ) -> float | None:
        """The Job controller's order when the attempt is already written: create the
        workers, then write one status that counts them (count_created), or hold it when the
        gang was created placed. Writing "0/N created" first cost a status patch per job and
        said nothing a user acts on."""
        accepted = decision.events  # "job accepted": the status counting them follows
        # The pods carry this decision's status (start times, the Created condition).
        decided = with_status(resolved, decision.status)
        try:
            created = await self._execute.create_workers(read, decision, decided)
        except (Refused, Rejected) as refused:
            self._placer.withdraw(key)
            self._execute.record_events(read.body, accepted)
            return await self._not_created(
                key, read, decision, refused, resolved=resolved, pods=seen.pods
            )
        pods = seen.pods + created
        counted = count_created(
            decided, decision, pods, seen.now, seen.waiting, service_exists=seen.service_exists
        )
        if may_hold(counted, created, decided.job.spec.workers):
            held = Held(read.meta.uid, read.status, counted.status, accepted + counted.events)
            return self._hold(key, held, counted.requeue_after)
        self._execute.record_events(read.body, accepted)
        return await self._execute_decision(key, read, counted, decided, pods)

    async def _execute_decision(
        self,
        key: JobKey,
        read: JobRead,
        decision: Decision,
        resolved: ResolvedJob | None,
        pods: list[WorkerPod],
    ) -> float | None:
        """Hand the gang to the placer or take it back, write the status, then act."""
        if decision.wants_placement and resolved is not None:
            self._placer.submit(key, ticket_of(resolved, decision, pods))
        else:
            self._placer.withdraw(key)
        self._track_workers(key, resolved.job if resolved else None, decision, pods)
        try:
            read = await self._execute.write_status(read, decision)
        except Conflict as conflict:
            logger.debug("%s/%s: %s; retrying", *key, conflict)
            return CONFLICT_RETRY_SECONDS
        self._books.drop_held(key)  # written, or equal to what is written
        # Only once the new attempt is written: a lost write is decided again from the
        # same evidence.
        self._departures.keep_only(key, decision.status.attempt)
        try:
            await self._execute.act(read, decision, resolved)
        except Conflict as conflict:  # our Workload changed under a write: decide again
            logger.debug("%s/%s: %s; retrying", *key, conflict)
            return CONFLICT_RETRY_SECONDS
        except (Refused, Rejected) as refused:
            return await self._not_created(
                key, read, decision, refused, resolved=resolved, pods=pods
            )
        self._books.created(key)
        recovered = reconciled(read.meta, read.status, self._clock())
        if recovered is not None:
            read = await self._execute.write_status(read, recovered)
            await self._execute.act(read, recovered, None)
        return decision.requeue_after

    async def _not_created(
        self,
        key: JobKey,
        read: JobRead,
        decision: Decision,
        error: Refused | Rejected,
        *,
        resolved: ResolvedJob | None,
        pods: list[WorkerPod],
    ) -> float | None:
        if isinstance(error, Refused):
            network = resolved.job.spec.network if resolved else None
            return await self._refused(key, read, decision, error, network=network)
        # The API server refused a pod the schema let through: the spec cannot run as
        # written. Say so on the job; nothing else to do.
        message = f"pod rejected: {error}"
        invalid = decide_invalid(read.meta, decision.status, pods, message, self._clock())
        read = await self._execute.write_status(read, invalid)
        await self._execute.act(read, invalid, None)
        return decision.requeue_after

    async def _refused(
        self,
        key: JobKey,
        read: JobRead,
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
            read.meta,
            decision.status,
            refused.what,
            refused.message,
            self._clock(),
            explanation=explanation,
        )
        try:
            read = await self._execute.write_status(read, failed)
            await self._execute.act(read, failed, None)
        except Conflict:
            return CONFLICT_RETRY_SECONDS
        count = self._books.refused(key)
        metrics.RECONCILE_ERRORS.inc()
        logger.warning("%s/%s: %s", read.meta.namespace, read.meta.name, failed.status.message)
        return REFUSED_BACKOFF.delay(count)

    def _hold(self, key: JobKey, held: Held, requeue_after: float | None) -> float:
        """Keep `held` unwritten until the next reconcile: HOLD_SECONDS away, or sooner
        if its decision asked to be looked at again sooner."""
        self._placer.withdraw(key)
        self._books.hold(key, held)
        return min(HOLD_SECONDS, requeue_after or HOLD_SECONDS)

    async def _write_held(self, key: JobKey, read: JobRead, held: Held, then: float) -> float:
        """Write a held status as it was decided, with its news; reconcile again in `then`."""
        try:
            read = await self._execute.write_status(read, Decision(held.status, events=held.events))
        except Conflict as conflict:
            logger.debug("%s/%s: %s; retrying", *key, conflict)
            return CONFLICT_RETRY_SECONDS
        self._books.drop_held(key)
        self._execute.record_events(read.body, held.events)
        return then

    def _forget(self, key: JobKey) -> None:
        """The job is gone or going: drop everything kept about it."""
        self._placer.withdraw(key)
        self._departures.forget(key)
        self._books.forget(key)
        self._pod_events.forget(key)
        if self._poller:
            self._poller.forget(key)

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

    def _understand(
        self, key: JobKey, read: JobRead, status: TrainingJobStatus
    ) -> Understood | str:
        """The job, with `status` (the written or the held one), resolved once, and its
        Kueue admission; or why it cannot run as written (InvalidSpec's message)."""
        try:
            resolved = self._resolve(read.job(status))
            admission = self._admission(key, resolved.job)
            workload = admission.workload if admission is not None else None
            if admission is not None and workload is not None and workload.admitted:
                flavors = self._workloads.flavors(workload.flavors) if self._workloads else []
                if flavors is None:  # not in our cache yet: its watch event is due
                    admission = replace(admission, flavors_missing=workload.flavors)
                else:
                    resolved = self._resolve(with_flavors(resolved.job, flavors))
        except InvalidSpec as invalid:
            return str(invalid)
        return Understood(resolved, admission)

    def _resolve(self, job: TrainingJob) -> ResolvedJob:
        return resolve_job(
            job, self._levels, arbiter_dir=self._arbiter_dir, gpu_claims=self._gpu_claims
        )

    def _decide(self, key: JobKey, understood: Understood, seen: Seen) -> Decision:
        resolved = understood.resolved
        attempt = resolved.job.status.attempt
        reports = self._poller.reports(key, attempt) if self._poller else {}
        decision = decide(
            resolved,
            seen.pods,
            seen.now,
            seen.waiting,
            reports,
            nodes=self._nodes(seen.pods, attempt),
            admission=understood.admission,
            service_exists=seen.service_exists,
            service_stale=seen.service_stale,
            host_unpublished=seen.host_unpublished,
            memory=self._books.memory(key),
        )
        self._books.remember(key, decision.memory)
        return decision

    def _service(
        self, key: JobKey, uid: str, attempt: int, pods: list[WorkerPod]
    ) -> tuple[bool, bool, bool]:
        """Whether the job's EndpointSlice names exactly `attempt`'s live workers (the watch
        shows it, or this reconciler applied it moments ago), whether it names others
        (written again at once), and whether worker 0's address is still unnamed
        (lifecycle/endpoints.py)."""
        workers = published((p for p in pods if p.owner_uid == uid), attempt)
        wanted = addresses(workers)
        states = self._service_states(key)
        applied = self._books.service_exists(key, (attempt, wanted), (attempt, wanted) in states)
        self._books.foreign_slices(key, foreign(states))
        current, stale = service_state(states, attempt, wanted, applied)
        in_flight = self._books.service_in_flight(key)
        return current, stale, host_unpublished(states, attempt, workers, in_flight)

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
