"""The operator's wiring: kopf runs the process (startup, cleanup, probes);
our own informers (job_cache.py, cluster_cache.py) follow the cluster and wake
the work queue.

kopf watches no resource: no change-tracking handlers are used, so kopf writes
no annotations and no finalizers onto TrainingJobs (deleting a job never waits
for the operator), and everything the operator knows is rebuilt from the
cluster on start. kopf's indexes were used once; they keep objects deleted
while a watch was down (see job_cache.py), and kopf's per-event machinery was
a third of the operator's CPU at 2,000 pods. Reconciles start only after every
store is filled, so the first ones after a restart already see every pod.

High availability: every replica runs the informers and caches, so a standby
is warm; only the Lease holder starts the reconcile workers, the placer, the
status poller, the events lookup and the resync, and every API write is gated on the Lease
(kube/leadership.py). A standby's queue fills from events while it waits
and is worked off the moment it leads.
"""

import asyncio
import contextlib
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import kopf

from trainwave import contract
from trainwave.api.reasons import Reason
from trainwave.api.trainingjob import JobKey
from trainwave.controller import allocator, metrics
from trainwave.controller.admission_guards import AdmissionGuards
from trainwave.controller.cluster_cache import ClusterCache
from trainwave.controller.departures import Departures
from trainwave.controller.job_cache import JobCache
from trainwave.controller.kube import KubeClient, load_config
from trainwave.controller.kueue_api import discover_version
from trainwave.controller.placer import Placer
from trainwave.controller.pod_events import PodEvents
from trainwave.controller.reconciler import POD_BATCH_SECONDS, Reconciler
from trainwave.controller.reporting import ANY_NETWORK, Network, StatusPoller
from trainwave.controller.workloads import WorkloadCache
from trainwave.kube.leadership import LeaderElector
from trainwave.kube.queue import WorkQueue
from trainwave.kube.recorder import EventRecorder, Rate
from trainwave.placement.queueing import DEFAULT_MAX_SKIPS, QueuePolicy
from trainwave.placement.topology import DEFAULT_LEVELS

logger = logging.getLogger(__name__)


@dataclass
class Options:
    metrics_port: int = contract.DEFAULT_METRICS_PORT
    workers: int = 8  # --workers
    resync_seconds: float = 300.0
    topology_levels: tuple[str, ...] = DEFAULT_LEVELS
    runtime_image: str = contract.DEFAULT_RUNTIME_IMAGE
    arbiter_dir: str | None = None  # the node-local arbiter's socket directory, if it runs
    gpu_claims: bool = False  # shared workers get a DRA ResourceClaim for their GPU
    status_networks: tuple[Network, ...] = ANY_NETWORK
    status_interval_seconds: float = 15.0  # between two reads of a worker's /status
    namespaces: tuple[str, ...] = ()  # names or patterns; empty: every namespace
    status_key_secret: tuple[str, str] = ("trainwave-system", contract.DEFAULT_STATUS_KEY_SECRET)
    leadership: LeaderElector | None = None  # None: act alone (no leader election)
    kueue: bool = False  # admit queue-labelled jobs through Kueue Workloads
    queue_max_skips: int = DEFAULT_MAX_SKIPS  # the queue's backfill bound (queueing.py rule 3)


# Reasons whose news comes from outside and may flap: Kueue rewrites a pending
# Workload's message as other jobs come and go. The first few changes pass at once;
# after that, one a minute (per job).
EVENT_RATES = {Reason.KUEUE_PENDING: Rate(burst=3, every=60.0)}

OPTIONS = Options()
_QUEUE: dict[str, WorkQueue] = {}
_PLACER: dict[str, Placer] = {}
_CACHE: dict[str, ClusterCache | JobCache | WorkloadCache | AdmissionGuards] = {}
_DEPARTURES = Departures()


@kopf.on.startup()
async def start(*, settings: kopf.OperatorSettings, memo: Any, **_: Any) -> None:
    # kopf's own Events (handler errors) stay; its progress storage is unused.
    settings.posting.level = logging.WARNING
    # No CRD or namespace scanning: the resources are known, and it needs less RBAC.
    settings.scanning.disabled = True
    settings.networking.request_timeout = 60
    # API calls are blocking and run in threads: enough of them for every
    # reconcile worker to create a gang's pods in parallel, and as many
    # pooled connections, or the pool (not the API server) sets the pace.
    threads = OPTIONS.workers * 8
    loop = asyncio.get_running_loop()
    loop.set_default_executor(ThreadPoolExecutor(max_workers=threads, thread_name_prefix="kube"))
    kube = KubeClient(load_config(pool_size=threads))
    if OPTIONS.leadership is not None:
        kube.guard = OPTIONS.leadership.check
    # Kueue's API version, before anything starts: where Kueue is missing, this start
    # fails with a message naming what is served, and kopf retries it.
    kueue_version = discover_version(kube) if OPTIONS.kueue else None
    # Nodes and active pods for placement, followed by watches instead of listed
    # every round. Its informers run in their own threads.
    cache = ClusterCache(kube, gpu_claims=OPTIONS.gpu_claims)
    cache.start()
    _CACHE["cluster"] = cache
    # The jobs, their workers and Services, for reconciles; a change wakes the job.
    jobs = JobCache(
        kube,
        lambda key: loop.call_soon_threadsafe(_wake, key),
        wake_pod=lambda key: loop.call_soon_threadsafe(_wake_batched, key),
        # Recorded on the informer thread before the pod leaves the store, not queued
        # on the loop: a reconcile running meanwhile must find it in one or the other.
        on_departure=_DEPARTURES.record,
        namespaces=OPTIONS.namespaces,
    )
    _CACHE["jobs"] = jobs
    workloads = None
    if kueue_version is not None:
        # Kueue's Workloads of queued jobs: an admission or eviction wakes the job.
        workloads = WorkloadCache(
            kube,
            lambda key: loop.call_soon_threadsafe(_wake, key),
            version=kueue_version,
            namespaces=OPTIONS.namespaces,
        )
        workloads.start()
        _CACHE["workloads"] = workloads
    # What could change or refuse a pod on its way in: a gang is placed before its pods
    # exist only where nothing can (admission_guards.py). Not waited for: until listed,
    # every gang takes the gate.
    guards = AdmissionGuards(kube, namespaces=OPTIONS.namespaces)
    guards.start()
    _CACHE["guards"] = guards
    placer = Placer(
        kube,
        OPTIONS.topology_levels,
        _wake,
        cache.view,
        policy=QueuePolicy(max_skips=OPTIONS.queue_max_skips),
        settled=cache.settled,
        present=cache.present,
    )
    # Any pod or node change may free room (a foreign pod too): the cache's thread
    # pokes the placer on the loop.
    cache.on_change(lambda: loop.call_soon_threadsafe(placer.poke))

    def wake_jobs_on(nodes: set[str]) -> None:
        # A node lost or turned NotReady: its workers' jobs judge it (failure policy).
        for key in jobs.jobs_on(nodes):
            _wake(key)

    cache.on_node_health(lambda nodes: loop.call_soon_threadsafe(wake_jobs_on, nodes))
    poller = StatusPoller(
        _wake, networks=OPTIONS.status_networks, interval=OPTIONS.status_interval_seconds
    )
    pod_events = PodEvents(kube.pod_events, _wake)
    recorder = EventRecorder(kube.post_event, namespaces=OPTIONS.namespaces, rates=EVENT_RATES)
    recorder.start()
    memo.recorder = recorder
    # Read (or created) once: every job's status key derives from it. Failing here
    # fails the start, loudly, rather than running with reports nobody can verify.
    master_key = await asyncio.to_thread(kube.master_status_key, *OPTIONS.status_key_secret)
    reconciler = Reconciler(
        kube,
        record_event=recorder.record,
        job_body=jobs.body,
        worker_pods=jobs.worker_pods,
        service_states=jobs.service_states,
        placer=placer,
        levels=OPTIONS.topology_levels,
        runtime_image=OPTIONS.runtime_image,
        arbiter_dir=OPTIONS.arbiter_dir,
        gpu_claims=OPTIONS.gpu_claims,
        poller=poller,
        master_key=master_key,
        departures=_DEPARTURES,
        node_health=cache.node_health,
        workloads=workloads,
        guards=guards,
        pod_events=pod_events,
    )
    queue = WorkQueue(reconciler)
    _QUEUE["jobs"] = queue
    jobs.start()  # the first LIST wakes every job: queued until the workers start
    # No reconcile before every store is filled: a job read without its pods
    # would look as if it had none.
    stores: list[tuple[str, JobCache | ClusterCache | WorkloadCache]] = [
        ("job", jobs),
        ("cluster", cache),
    ]
    if workloads is not None:
        stores.append(("workload", workloads))
    for name, informers in stores:
        if not await asyncio.to_thread(informers.wait_synced, 60):
            logger.warning("%s cache not synced after 60 s; its informers keep trying", name)
    # The first LISTs decoded every node and pod page by page; what they freed goes back.
    await asyncio.to_thread(allocator.trim)
    _PLACER["gangs"] = placer
    memo.lead = asyncio.create_task(_lead(queue, placer, poller, pod_events, jobs))
    metrics.serve(
        OPTIONS.metrics_port,
        jobs.phase_counts,
        lambda: {**cache.stats(), **jobs.stats()},
        jobs.goodput_ratios,
    )
    logger.info("trainwave operator started: %d reconcile workers", OPTIONS.workers)


async def _lead(
    queue: WorkQueue, placer: Placer, poller: StatusPoller, pod_events: PodEvents, jobs: JobCache
) -> None:
    """Wait for the Lease, then start everything that writes. Never returns while leading:
    leadership ends only with the process (leadership.fail_stop)."""
    election = OPTIONS.leadership
    if election is not None:
        leading = asyncio.Event()
        loop = asyncio.get_running_loop()
        election.when_leading(lambda: loop.call_soon_threadsafe(leading.set))
        if not leading.is_set():
            logger.info("standby: caches warm, waiting for the lease as %s", election.identity)
        await leading.wait()
        logger.info("leading: reconciling and placing (%d jobs queued)", queue.depth)
    metrics.LEADER.set(1)
    queue.start(OPTIONS.workers)
    await asyncio.gather(placer.run(), poller.run(), pod_events.run(), _resync(queue, jobs))


@kopf.on.cleanup()
async def stop(memo: Any, **_: Any) -> None:
    metrics.LEADER.set(0)
    if getattr(memo, "lead", None):
        memo.lead.cancel()  # and with it the placer, the pollers and the resync
    placer = _PLACER.pop("gangs", None)
    if placer is not None:
        # Gangs already released are patched to the end, so no gang stops half ungated.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(placer.drain(), 5)
    recorder = getattr(memo, "recorder", None)
    if recorder is not None:
        # Events already decided are posted before the process ends, within reason.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(recorder.drain(), 5)
        await recorder.stop()
    for name in ("jobs", "cluster", "workloads", "guards"):
        cache = _CACHE.pop(name, None)
        if cache is not None:
            await asyncio.to_thread(cache.stop)
    queue = _QUEUE.pop("jobs", None)
    if queue:
        await queue.stop()


@kopf.on.probe(id="queueDepth")
def queue_depth(**_: Any) -> int:
    queue = _QUEUE.get("jobs")
    return queue.depth if queue else 0


async def _resync(queue: WorkQueue, jobs: JobCache) -> None:
    """Reconcile every job now and then: deadlines and polls are timed, but this is
    the safety net for a decision that waits on time rather than on an event."""
    while True:
        await asyncio.sleep(OPTIONS.resync_seconds)
        for key in jobs.job_keys():
            queue.add(key)


def _wake(key: JobKey) -> None:
    queue = _QUEUE.get("jobs")
    if queue is not None:
        queue.add(key)


def _wake_batched(key: JobKey) -> None:
    """A worker pod changed: reconcile its job within POD_BATCH_SECONDS, not at once.
    A gang's pods are created, released, bound and started within moments of each
    other; one reconcile then sees them all instead of one per pod, each writing a
    status that says "2/4 workers bound". Mirrors the Job controller's
    syncJobBatchPeriod (pkg/controller/job/job_controller.go, 1 s)."""
    queue = _QUEUE.get("jobs")
    if queue is not None:
        queue.add(key, after=POD_BATCH_SECONDS)
