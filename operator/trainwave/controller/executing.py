"""Carry out a decision: write the job's status, create and delete its children.

The acting half of the reconciler (reconciler.py reads and decides): every call to
the API server a decision leads to is made here, and what each call leaves for the
next reconcile to expect is noted in the `Bookkeeping`.
"""

import asyncio
import logging
from collections.abc import Callable, Iterable
from dataclasses import replace
from datetime import datetime
from typing import Any

from kubernetes.client.exceptions import ApiException

from trainwave import contract
from trainwave.api.reasons import Reason
from trainwave.api.status import Phase, TrainingJobStatus
from trainwave.api.trainingjob import TrainingJob
from trainwave.builders.names import service_name
from trainwave.builders.pods import build_worker_pods
from trainwave.builders.service import MANAGED_BY, build_endpoint_slices, build_service
from trainwave.builders.status_key import build_status_key_secret
from trainwave.builders.workload import build_workload
from trainwave.controller import metrics
from trainwave.controller.admission_guards import AdmissionGuards
from trainwave.controller.api_errors import Refused, Rejected, status_message
from trainwave.controller.bookkeeping import Bookkeeping
from trainwave.controller.goodput_metrics import record_goodput
from trainwave.controller.kube import KubeClient
from trainwave.controller.placement_inputs import Ticket, changed_on_the_way_in
from trainwave.controller.placer import Placer
from trainwave.controller.reading import JobRead, kept_body
from trainwave.controller.reporting import StatusPoller
from trainwave.controller.workloads import (
    WorkloadCache,
    create_workload,
    patch_workload_status,
    set_workload_active,
)
from trainwave.lifecycle.admission import finished_conditions, queue_of, released_conditions
from trainwave.lifecycle.decide import Decision, JobEvent
from trainwave.lifecycle.endpoints import addresses
from trainwave.lifecycle.observed import PodPhase, WorkerPod, observe_pod
from trainwave.lifecycle.workload_actions import WorkloadAction
from trainwave.resolving import ResolvedJob
from trainwave.signatures import job_key

logger = logging.getLogger(__name__)

# The disruptions that goodput decisions cause, by the reason they restart the gang with.
_DISRUPTION_CAUSES: dict[str, str] = {
    Reason.STRAGGLER_REPLACED: "straggler",
    Reason.PREFLIGHT_FAILED: "preflight",
}


class Executor:
    def __init__(
        self,
        kube: KubeClient,
        books: Bookkeeping,
        *,
        placer: Placer,
        record_event: Callable[[dict[str, Any], JobEvent], None],
        runtime_image: str,
        poller: StatusPoller | None,
        master_key: bytes,
        workloads: WorkloadCache | None,
        guards: AdmissionGuards | None,
        clock: Callable[[], datetime],
    ):
        self._kube = kube
        self._books = books
        self._placer = placer
        self._record_event = record_event
        self._runtime_image = runtime_image
        self._poller = poller
        self._master_key = master_key  # each job's status key is derived from it
        self._workloads = workloads  # None: Kueue integration off
        self._guards = guards  # None: every gang is created behind the gate
        self._clock = clock

    def record_events(self, body: dict[str, Any], events: Iterable[JobEvent]) -> None:
        for event in events:
            self._record_event(body, event)  # posted in the background, in order

    async def write_status(self, read: JobRead, decision: Decision) -> JobRead:
        """The job once `decision.status` is written (as it was if it is written already);
        raises Conflict when the job changed since `read` (the resourceVersion guard)."""
        old, meta = read.status, read.meta
        if decision.status == old:
            return read
        status = decision.status.model_dump(by_alias=True, mode="json")
        # Kept as the job cache keeps a body (reading.kept_body): the bookkeeping holds the
        # answer until the watch shows this write, which at 2,000 jobs was all of them at once.
        updated = kept_body(
            await asyncio.to_thread(
                self._kube.patch_job_status, meta.namespace, meta.name, meta.resourceVersion, status
            )
        )
        self._books.wrote((meta.namespace, meta.name), meta.resourceVersion, updated)
        self._record(read, old, decision)
        return read.written(updated, decision.status)

    def _record(self, read: JobRead, old: TrainingJobStatus, decision: Decision) -> None:
        new, meta = decision.status, read.meta
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
        # Each restart moves exactly one of the status counters by cause; a worker replaced
        # alone moves disruptions too, but restarts no gang.
        replaced = _replaced(old) - _replaced(new)
        if replaced < 0:
            metrics.WORKERS_REPLACED.labels(_replacement_cause(new)).inc(-replaced)
        for cause, before, after in (
            ("hang" if new.reason == Reason.HUNG else "failure", old.restarts, new.restarts),
            (
                _DISRUPTION_CAUSES.get(new.reason, "disruption"),
                old.disruptions,
                new.disruptions + (replaced if replaced < 0 else 0),
            ),
            ("ignored", old.ignored_restarts, new.ignored_restarts),
            ("preemption", old.preemptions, new.preemptions),
        ):
            if after > before:
                metrics.GANG_RESTARTS.labels(cause).inc(after - before)
        if decision.all_running_after is not None:
            metrics.ALL_RUNNING_SECONDS.observe(decision.all_running_after)
        record_goodput(old, decision)

    async def act(self, read: JobRead, decision: Decision, resolved: ResolvedJob | None) -> None:
        """Carry out `decision` for the job `read`, written already; `resolved` is the job
        resolved once by the reconciler (None: invalid, nothing is built for it)."""
        kube, meta = self._kube, read.meta
        self.record_events(read.body, decision.events)
        await self._mark_nodes(decision)
        if decision.workload != WorkloadAction.NONE and resolved is not None:
            await self._workload(read, decision, resolved)
        await asyncio.gather(
            *(asyncio.to_thread(kube.delete_pod, meta.namespace, n) for n in decision.delete_pods),
            *(
                asyncio.to_thread(kube.delete_pod, meta.namespace, n, force=True)
                for n in decision.force_delete_pods
            ),
        )
        if decision.create_ranks and resolved is not None:
            await self.create_workers(read, decision, with_status(resolved, decision.status))
        if resolved is not None and decision.wants_service:
            await self._publish(resolved.job, decision)
        if decision.delete_job:
            logger.info(
                "%s/%s: ttlSecondsAfterFinished passed; deleting", meta.namespace, meta.name
            )
            await asyncio.to_thread(kube.delete_job, meta.namespace, meta.name, meta.uid)

    async def _publish(self, job: TrainingJob, decision: Decision) -> None:
        """The EndpointSlices naming the decided workers, owned by the Service: applied with
        the pods (`create_workers`), or here first when it was not. A refusal is the
        names' problem, not the spec's: a ReplicaFailure retried with backoff, the workers
        keep running (never an invalid spec that fails the job)."""
        kube, attempt, workers = self._kube, decision.status.attempt, decision.service_endpoints
        key = (job.metadata.namespace, job.metadata.name)
        try:
            # One write, not two in a row, on the reconcile that found the gang addressed:
            # at 2,000 jobs the second held the reconcile workers a third longer.
            service_uid = self._books.service_uid(key)
            if service_uid is None:
                service = build_service(job, attempt)
                service_uid = await asyncio.to_thread(kube.apply_service, service)
            slices = build_endpoint_slices(job, attempt, workers, service_uid)
            await asyncio.gather(*(asyncio.to_thread(kube.apply_endpoint_slice, s) for s in slices))
        except Rejected as rejected:
            raise Refused(f"endpoints of service {job.metadata.name}", str(rejected)) from None
        if self._books.foreign_slices(key):
            # The Service lost its selector when it was applied: kube-controller-manager no
            # longer writes its slices, but leaves those it wrote, with old addresses, and
            # its Endpoints, which it would mirror into a slice again: those go first.
            name = service_name(job.metadata.name, attempt)
            await asyncio.to_thread(kube.delete_foreign_endpoints, key[0], name)
            await asyncio.to_thread(kube.delete_foreign_slices, key[0], name, MANAGED_BY)
        self._books.applied_service(key, (attempt, addresses(workers)))

    async def create_workers(
        self, read: JobRead, decision: Decision, resolved: ResolvedJob
    ) -> list[WorkerPod]:
        """Create the pods of `decision.create_ranks` for `resolved`, whose job carries the
        decided status (attempt, last preemption), placed already when the placer finds a
        new gang room at once (`_place_at_creation`), else behind the gate; the workers they
        are, as the watch will show them once it catches up."""
        kube, meta = self._kube, read.meta
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
        placed = await self._place_at_creation(read, decision, resolved, pods)
        attempt = decision.status.attempt
        service, *results = await asyncio.gather(
            asyncio.to_thread(kube.apply_service, build_service(job, attempt)),
            *(asyncio.to_thread(kube.create_pod, pod) for pod in placed or pods),
            return_exceptions=True,
        )
        if attempt > 0 and len(decision.create_ranks) == job.spec.workers:
            # A new gang: the gang before it had the Service of the attempt before, whose
            # names no worker of this one uses (builders/service.py). Older ones, left by a
            # gang that never got this far, go with the job.
            previous = service_name(meta.name, attempt - 1)
            await asyncio.to_thread(kube.delete_service, meta.namespace, previous)
        if isinstance(service, str) and service:
            self._books.applied_service_with_pods((meta.namespace, meta.name), service)
        # A refused Service is left to the publishing reconcile, which reports it.
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
        names = frozenset(pod["metadata"]["name"] for pod in pods)
        self._books.expect_pods((meta.namespace, meta.name), decision.status.attempt, names)
        workers = (observe_pod(pod) for pod in pods)
        return [worker for worker in workers if worker is not None]

    async def _place_at_creation(
        self,
        read: JobRead,
        decision: Decision,
        resolved: ResolvedJob,
        pods: list[dict[str, Any]],
    ) -> list[dict[str, Any]] | None:
        """The gang's pods pinned and ungated when the placer finds it room before they
        exist (placer.place_now); None: they are created behind the gate. Only a whole new
        gang of whole GPUs (or none) outside Kueue, only where nothing can change or refuse
        a pod on the way in (admission_guards.py)."""
        job, meta = resolved.job, read.meta
        if (
            self._guards is None
            or len(decision.create_ranks) != job.spec.workers
            or resolved.shared is not None
            or (self._workloads is not None and queue_of(job))
            or any(pod["spec"].get("runtimeClassName") for pod in pods)
            or self._guards.blocker(meta.namespace)
        ):
            return None
        ticket = ticket_of(resolved, decision)
        placed = await self._placer.place_now((meta.namespace, meta.name), ticket, pods)
        webhooks = self._guards.pod_webhooks()
        if placed and webhooks:
            changed = await self._changed_on_the_way_in(placed[0], webhooks)
            if changed:
                logger.info("%s/%s: not placed at creation: %s", meta.namespace, meta.name, changed)
                for pod in placed:
                    self._placer.forget_unborn(meta.namespace, pod["metadata"]["name"])
                return None
        return placed

    async def _changed_on_the_way_in(self, pod: dict[str, Any], webhooks: list[str]) -> str:
        """What a mutating webhook would change of `pod` that its placement relied on, from
        a server-side dry run of its create; "" when nothing. The gang's first worker
        stands for all of them: they differ in names, rank labels and environment only.
        One request per gang placed at creation, and only while such webhooks exist."""
        try:
            stored = await asyncio.to_thread(self._kube.dry_run_pod, pod)
        except Exception as error:  # refused, or a webhook without dry-run support
            metrics.CREATION_DRY_RUNS.labels("failed").inc()
            reason = status_message(error) if isinstance(error, ApiException) else repr(error)
            return f"a dry run of its create failed ({reason}); mutating webhooks {webhooks}"
        changed = changed_on_the_way_in(pod, stored)
        metrics.CREATION_DRY_RUNS.labels("changed" if changed else "unchanged").inc()
        return (
            f"admission would change its {changed} (mutating webhooks {webhooks})"
            if changed
            else ""
        )

    async def _workload(self, read: JobRead, decision: Decision, resolved: ResolvedJob) -> None:
        """Create, release, finish, (de)activate the job's Workload, as lifecycle/admission.py
        decided."""
        job, meta = resolved.job, read.meta
        action = decision.workload
        workloads = self._workloads
        if workloads is None:  # Kueue integration off: decide asks for no Workload action
            return
        version = workloads.version  # the one kueue_api.py discovered
        if action == WorkloadAction.CREATE:
            body = build_workload(resolved, queue_of(job), self._runtime_image)
            await asyncio.to_thread(create_workload, self._kube, body, version=version)
            return
        workload = workloads.workload((meta.namespace, meta.name), meta.uid)
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


def _replaced(status: TrainingJobStatus) -> int:
    return status.replacements.total if status.replacements is not None else 0


def _replacement_cause(status: TrainingJobStatus) -> str:
    pending = status.replacements.pending if status.replacements is not None else []
    return pending[-1].cause if pending else "disruption"


def ticket_of(resolved: ResolvedJob, decision: Decision, pods: Iterable[WorkerPod] = ()) -> Ticket:
    """What the placer is asked for the job's gang of the decided attempt; `pods`: the
    job's pods as the reconcile saw them, for the attempt's workers that already ran to
    completion (none for a gang about to be created)."""
    job, shared = resolved.job, resolved.shared
    created = job.metadata.creationTimestamp
    attempt = decision.status.attempt
    finished = sum(
        1 for p in pods if p.attempt == attempt and p.phase == PodPhase.SUCCEEDED and not p.departed
    )
    return Ticket(
        attempt=attempt,
        request=resolved.gang,
        priority=job.spec.placement.priority,
        arrival=created.timestamp() if created else 0.0,
        network=job.spec.network,
        shared_how=shared.how if shared else "",
        spread_wait=job.spec.placement.preferred_level_wait_seconds,
        finished=finished,
    )


def with_status(resolved: ResolvedJob, status: TrainingJobStatus) -> ResolvedJob:
    """`resolved` with the decided status, which the pods built from it carry."""
    return replace(resolved, job=resolved.job.model_copy(update={"status": status}))
