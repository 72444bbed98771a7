"""kopf wiring: watches feed indexes and wake the work queue; nothing else.

No change-tracking handlers are used, so kopf writes no annotations and no
finalizers onto TrainingJobs: deleting a job never waits for the operator,
and everything the operator knows is rebuilt from the cluster on start.
kopf holds back event handlers until every index is filled, so the first
reconciles after a restart already see every existing pod.
"""

import asyncio
import logging
from collections import Counter
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import kopf

from trainwave import contract
from trainwave.controller import metrics
from trainwave.controller.cluster_cache import ClusterCache
from trainwave.controller.departures import Departures
from trainwave.controller.kube import KubeClient, load_config
from trainwave.controller.placer import Placer
from trainwave.controller.queue import WorkQueue
from trainwave.controller.reconciler import JobKey, Reconciler
from trainwave.controller.reporting import ANY_NETWORK, Network, StatusPoller
from trainwave.lifecycle.observed import WorkerPod, observe_pod
from trainwave.placement.topology import DEFAULT_LEVELS

logger = logging.getLogger(__name__)

WORKER_SELECTOR = {contract.LABEL_JOB_NAME: kopf.PRESENT}


@dataclass
class Options:
    metrics_port: int = contract.DEFAULT_METRICS_PORT
    workers: int = 4
    resync_seconds: float = 300.0
    topology_levels: tuple[str, ...] = DEFAULT_LEVELS
    runtime_image: str = contract.DEFAULT_RUNTIME_IMAGE
    status_networks: tuple[Network, ...] = ANY_NETWORK


OPTIONS = Options()
_QUEUE: dict[str, WorkQueue] = {}
_PLACER: dict[str, Placer] = {}
_CACHE: dict[str, ClusterCache] = {}
_DEPARTURES = Departures()


@kopf.index("", "v1", "pods", labels=WORKER_SELECTOR)
def worker_pods(namespace: str, labels: Any, body: Any, **_: Any) -> dict[JobKey, WorkerPod] | None:
    pod = observe_pod(_plain(body))
    return {(namespace, labels[contract.LABEL_JOB_NAME]): pod} if pod else None


@kopf.index("", "v1", "services", labels={contract.LABEL_JOB_NAME: kopf.PRESENT})
def job_services(namespace: str, labels: Any, **_: Any) -> dict[JobKey, bool]:
    return {(namespace, labels[contract.LABEL_JOB_NAME]): True}


@kopf.index(contract.GROUP, contract.VERSION, contract.PLURAL)
def job_bodies(namespace: str, name: str, body: Any, **_: Any) -> dict[JobKey, dict[str, Any]]:
    """Each job as last watched: reconciles read it here instead of a GET per reconcile.
    A stale copy cannot do harm: status writes carry its resourceVersion (409, retry)."""
    return {(namespace, name): _plain(body)}


@kopf.index(contract.GROUP, contract.VERSION, contract.PLURAL)
def job_phases(namespace: str, name: str, status: Any, **_: Any) -> dict[str, JobKey]:
    return {str(status.get("phase") or "Pending"): (namespace, name)}


@kopf.on.event(contract.GROUP, contract.VERSION, contract.PLURAL)
def job_changed(namespace: str, name: str, **_: Any) -> None:
    _wake((namespace, name))


@kopf.on.event("", "v1", "pods", labels=WORKER_SELECTOR)
def worker_changed(namespace: str, labels: Any, event: Any, body: Any, **_: Any) -> None:
    key = (namespace, labels[contract.LABEL_JOB_NAME])
    if event.get("type") == "DELETED":
        pod = observe_pod(_plain(body))
        if pod is not None:
            _DEPARTURES.record(key, pod)
    _wake(key)


@kopf.on.startup()
async def start(
    *,
    settings: kopf.OperatorSettings,
    worker_pods: kopf.Index[JobKey, WorkerPod],
    job_services: kopf.Index[JobKey, bool],
    job_phases: kopf.Index[str, JobKey],
    job_bodies: kopf.Index[JobKey, dict[str, Any]],
    memo: Any,
    **_: Any,
) -> None:
    # kopf's own Events (handler errors) stay; its progress storage is unused.
    settings.posting.level = logging.WARNING
    # No CRD or namespace scanning: the resources are known, and it needs less RBAC.
    settings.scanning.disabled = True
    settings.watching.server_timeout = 300
    settings.networking.request_timeout = 60
    # API calls are blocking and run in threads: enough of them for every
    # reconcile worker to create a gang's pods in parallel, and as many
    # pooled connections, or the pool (not the API server) sets the pace.
    threads = OPTIONS.workers * 8
    asyncio.get_running_loop().set_default_executor(
        ThreadPoolExecutor(max_workers=threads, thread_name_prefix="kube")
    )
    kube = KubeClient(load_config(pool_size=threads))
    # Nodes and active pods for placement, followed by watches instead of listed
    # every round. Its informers run in their own threads.
    cache = ClusterCache(kube)
    cache.start()
    _CACHE["cluster"] = cache
    if not await asyncio.to_thread(cache.wait_synced, 60):
        logger.warning("cluster cache not synced after 60 s; its informers keep trying")

    def pods_of(key: JobKey) -> Iterable[WorkerPod]:
        return list(worker_pods.get(key, []))

    def body_of(key: JobKey) -> dict[str, Any] | None:
        found = list(job_bodies.get(key, []))
        return found[-1] if found else None

    placer = Placer(kube, OPTIONS.topology_levels, _wake, cache.view)
    # Any pod or node change may free room (a foreign pod too): the cache's thread
    # pokes the placer on the loop.
    loop = asyncio.get_running_loop()
    cache.on_change(lambda: loop.call_soon_threadsafe(placer.poke))

    def wake_jobs_on(nodes: set[str]) -> None:
        # A node lost or turned NotReady: its workers' jobs judge it (failure policy).
        for key, pods in list(worker_pods.items()):
            if any(p.node in nodes for p in pods):
                _wake(key)

    cache.on_node_health(lambda nodes: loop.call_soon_threadsafe(wake_jobs_on, nodes))
    poller = StatusPoller(_wake, networks=OPTIONS.status_networks)
    reconciler = Reconciler(
        kube,
        job_body=body_of,
        worker_pods=pods_of,
        has_service=lambda key: key in job_services,
        placer=placer,
        levels=OPTIONS.topology_levels,
        runtime_image=OPTIONS.runtime_image,
        poller=poller,
        departures=_DEPARTURES,
        node_health=cache.node_health,
    )
    queue = WorkQueue(reconciler)
    queue.start(OPTIONS.workers)
    _QUEUE["jobs"] = queue
    _PLACER["gangs"] = placer
    memo.placer = asyncio.create_task(placer.run())
    memo.poller = asyncio.create_task(poller.run())
    memo.resync = asyncio.create_task(_resync(queue, job_phases))
    metrics.serve(
        OPTIONS.metrics_port,
        lambda: Counter({p: len(keys) for p, keys in job_phases.items()}),
        cache.stats,
    )
    logger.info("trainwave operator started: %d reconcile workers", OPTIONS.workers)


@kopf.on.cleanup()
async def stop(memo: Any, **_: Any) -> None:
    for task in ("resync", "placer", "poller"):
        if getattr(memo, task, None):
            getattr(memo, task).cancel()
    _PLACER.pop("gangs", None)
    cache = _CACHE.pop("cluster", None)
    if cache is not None:
        await asyncio.to_thread(cache.stop)
    queue = _QUEUE.pop("jobs", None)
    if queue:
        await queue.stop()


def cluster_cache() -> ClusterCache | None:
    """The operator's watch-backed nodes and pods; None before startup and after cleanup."""
    return _CACHE.get("cluster")


@kopf.on.probe(id="queueDepth")
def queue_depth(**_: Any) -> int:
    queue = _QUEUE.get("jobs")
    return queue.depth if queue else 0


async def _resync(queue: WorkQueue, job_phases: kopf.Index[str, JobKey]) -> None:
    """Reconcile every job now and then: a safety net for anything a watch missed."""
    while True:
        await asyncio.sleep(OPTIONS.resync_seconds)
        for keys in list(job_phases.values()):
            for key in list(keys):
                queue.add(key)


def _wake(key: JobKey) -> None:
    queue = _QUEUE.get("jobs")
    if queue is not None:
        queue.add(key)


def _plain(body: Any) -> dict[str, Any]:
    return {key: body[key] for key in ("metadata", "spec", "status") if key in body}
