"""TrainingJobs, their worker pods and their EndpointSlices, as reconciles read them.

Three informers (kube/informer.py: one paginated LIST, then a WATCH; relist and
REPLACE after a failed or expired watch) fill the stores below. They replaced
kopf's indexes, which drop an entry only on a DELETED event: a pod deleted
while kopf's watch was down stayed in its index after the re-list, so the gang
kept waiting for a worker that no longer existed. Here a relist replaces each
store, and every job whose view changed in the replace is woken, exactly as
if the missed events had been seen; a worker the relist no longer finds is
handed to `on_departure` with the last state seen (kube/informer.py's tombstone).

A job is woken (`wake(key)`, from an informer thread) only when what its
reconcile reads changed: the job's resourceVersion, a worker's `WorkerPod`
record (a pod update that changes nothing decisions read wakes nobody), or
what its EndpointSlice names. A worker's change wakes it through `wake_pod`, which
the operator batches (handlers.py), as kube-controller-manager's Job controller
batches pod events: a gang's pods change together, one reconcile sees them all.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from typing import Any

from trainwave import contract
from trainwave.api.trainingjob import JobKey
from trainwave.builders.names import service_name
from trainwave.builders.service import MANAGED_BY, MANAGED_BY_LABEL, SERVICE_NAME_LABEL
from trainwave.controller.kube import KubeClient
from trainwave.controller.reading import kept_body
from trainwave.kube.index import ByOwner
from trainwave.kube.informer import (
    PAGE_SIZE,
    WATCH_SECONDS,
    Deleted,
    DeletedFinalStateUnknown,
    EventHandlers,
    InformerGroup,
    StoreFuncs,
)
from trainwave.kube.namespaced import AnyInformer, informer_in, watched
from trainwave.lifecycle.endpoints import FOREIGN, ServiceState
from trainwave.lifecycle.observed import WorkerPod, observe_pod

logger = logging.getLogger(__name__)

Wake = Callable[[JobKey], None]
Departure = Callable[[JobKey, WorkerPod], None]
Body = dict[str, Any]
SliceRecord = tuple[JobKey, ServiceState]  # owner; the attempt and addresses it names


class JobCache(InformerGroup):
    """Everything a reconcile reads, each kind followed by its own watch.

    `namespaces`: names or shell patterns (`team-*`) of the namespaces whose jobs
    are reconciled; empty means all. Names are watched each through its namespaced
    endpoints (kube/namespaced.py), so the operator needs list/watch only there; with a
    pattern the watches are cluster-wide and other namespaces are dropped on arrival.
    """

    def __init__(
        self,
        kube: KubeClient,
        wake: Wake,
        *,
        wake_pod: Wake | None = None,
        on_departure: Departure = lambda key, pod: None,
        namespaces: Iterable[str] = (),
        page_size: int = PAGE_SIZE,
        watch_seconds: int = WATCH_SECONDS,
    ):
        self._lock = threading.Lock()
        self._wake = wake
        self._wake_pod = wake_pod or wake
        self._namespaces = tuple(namespaces)
        self._bodies: dict[JobKey, Body] = {}
        self._pods: ByOwner[JobKey, WorkerPod] = ByOwner()
        # The EndpointSlices the operator wrote (builders/service.py), and per job what
        # they name.
        self._slices: dict[str, SliceRecord] = {}
        self._service_states: dict[JobKey, Counter[ServiceState]] = {}
        labelled = contract.LABEL_JOB_NAME  # a bare key selects "label present"
        common: dict[str, Any] = {"page_size": page_size, "watch_seconds": watch_seconds}
        group = (contract.GROUP, contract.VERSION)
        custom, core = kube.custom, kube.core
        self.jobs: AnyInformer[Body] = informer_in(
            "trainingjobs",
            self._namespaces,
            everywhere=partial(custom.list_cluster_custom_object, *group, contract.PLURAL),
            lister_in=lambda ns: partial(
                custom.list_namespaced_custom_object, *group, ns, contract.PLURAL
            ),
            convert=self._job_record,
            store=StoreFuncs(self._replace_jobs, self._put_job),
            **common,
        )
        self.pods: AnyInformer[tuple[JobKey, WorkerPod]] = informer_in(
            "worker-pods",
            self._namespaces,
            everywhere=partial(core.list_pod_for_all_namespaces, label_selector=labelled),
            lister_in=lambda ns: partial(core.list_namespaced_pod, ns, label_selector=labelled),
            convert=self._pod_record,
            store=StoreFuncs(self._replace_pods, self._put_pod),
            # A worker's last state, seen only on its DELETED event (departures.py),
            # or carried by a relist's tombstone when it went while the watch was down.
            handlers=EventHandlers(on_delete=_departure_handler(on_departure)),
            **common,
        )
        discovery = kube.discovery
        self.slices: AnyInformer[SliceRecord] = informer_in(
            "endpoint-slices",
            self._namespaces,
            everywhere=partial(
                discovery.list_endpoint_slice_for_all_namespaces, label_selector=labelled
            ),
            lister_in=lambda ns: partial(
                discovery.list_namespaced_endpoint_slice, ns, label_selector=labelled
            ),
            convert=self._slice_record,
            store=StoreFuncs(self._replace_slices, self._put_slice),
            **common,
        )

    @property
    def informers(self) -> tuple[AnyInformer[Any], ...]:
        return self.jobs, self.pods, self.slices

    # What reconciles read.

    def body(self, key: JobKey) -> Body | None:
        with self._lock:
            return self._bodies.get(key)

    def worker_pods(self, key: JobKey) -> list[WorkerPod]:
        with self._lock:
            return self._pods.of(key)

    def service_states(self, key: JobKey) -> frozenset[ServiceState]:
        """What the job's EndpointSlices name, one state per attempt they carry (a job of
        over 1,000 workers has several slices: builders/service.py); empty without one."""
        with self._lock:
            states = list(self._service_states.get(key, ()))
        named: dict[int, frozenset[tuple[str, str]]] = {}
        for attempt, addresses in states:
            named[attempt] = named.get(attempt, frozenset()) | addresses
        return frozenset(named.items())

    def jobs_on(self, nodes: set[str]) -> set[JobKey]:
        """The jobs with a worker bound to one of `nodes`."""
        with self._lock:
            return {key for key, pods in self._pods.items() if any(p.node in nodes for p in pods)}

    def job_keys(self) -> list[JobKey]:
        with self._lock:
            return list(self._bodies)

    def phase_counts(self) -> Counter[str]:
        with self._lock:
            bodies = list(self._bodies.values())
        return Counter(str((b.get("status") or {}).get("phase") or "Pending") for b in bodies)

    def goodput_ratios(self) -> list[tuple[str, str, float]]:
        """(namespace, name, status.goodput.ratio) of every job that has one: for metrics."""
        with self._lock:
            items = list(self._bodies.items())
        found = []
        for (namespace, name), body in items:
            ratio = ((body.get("status") or {}).get("goodput") or {}).get("ratio")
            if isinstance(ratio, int | float) and not isinstance(ratio, bool):
                found.append((namespace, name, float(ratio)))
        return found

    def stats(self) -> dict[str, tuple[int, int]]:
        """kind -> (objects held, relists): for metrics and tests."""
        with self._lock:
            held = {
                self.jobs.kind: len(self._bodies),
                self.pods.kind: len(self._pods),
                self.slices.kind: len(self._slices),
            }
        return {i.kind: (held[i.kind], i.relists) for i in self.informers}

    # Converters: raw object -> the record kept (None: not ours, keep nothing).

    def _watched(self, namespace: str) -> bool:
        return watched(namespace, self._namespaces)

    def _job_record(self, obj: Mapping[str, Any]) -> Body | None:
        namespace = (obj.get("metadata") or {}).get("namespace", "")
        if not self._watched(namespace):
            return None
        # Cut on arrival, as client-go informers do with a SetTransform function.
        return kept_body(obj)

    def _pod_record(self, obj: Mapping[str, Any]) -> tuple[JobKey, WorkerPod] | None:
        key = _owner_key(obj)
        if key is None or not self._watched(key[0]):
            return None
        pod = observe_pod(dict(obj))
        return (key, pod) if pod is not None else None

    def _slice_record(self, obj: Mapping[str, Any]) -> SliceRecord | None:
        key = _owner_key(obj)
        if key is None or not self._watched(key[0]):
            return None
        labels = (obj.get("metadata") or {}).get("labels") or {}
        if labels.get(MANAGED_BY_LABEL) != MANAGED_BY:
            # Another controller's: kube-controller-manager's, left from when the Service
            # had a selector (an operator before this one). Written again and deleted.
            return key, (FOREIGN, frozenset())
        attempt = str(labels.get(contract.LABEL_ATTEMPT))
        if attempt.isdigit() and labels.get(SERVICE_NAME_LABEL) != service_name(
            key[1], int(attempt)
        ):
            # An operator before this one named every attempt by the job's own Service; such
            # a slice of a later attempt is left as it was, for its pods' names, and goes
            # with the job. Only the attempt's own Service's slices say what DNS answers.
            return None
        named = frozenset(
            (str((e.get("targetRef") or {}).get("name", "")), str(address))
            for e in obj.get("endpoints") or ()
            for address in e.get("addresses") or ()
        )
        return key, (int(attempt) if attempt.isdigit() else -1, named)

    # Store writes, on informer threads; wakes are sent after the lock is released.

    def _replace_jobs(self, records: Mapping[str, Body]) -> None:
        new = {_split(name): body for name, body in records.items()}
        with self._lock:
            old, self._bodies = self._bodies, new
        keys = old.keys() | new.keys()
        self._wake_all(k for k in keys if _version(old.get(k)) != _version(new.get(k)))

    def _put_job(self, name: str, body: Body | None) -> None:
        key = _split(name)
        with self._lock:
            if body is None:
                self._bodies.pop(key, None)
            else:
                self._bodies[key] = body
        self._wake(key)

    def _replace_pods(self, records: Mapping[str, tuple[JobKey, WorkerPod]]) -> None:
        with self._lock:
            changed = self._pods.replace(records)
        self._wake_all(changed)

    def _put_pod(self, name: str, record: tuple[JobKey, WorkerPod] | None) -> None:
        with self._lock:
            old = self._pods.put(name, record)
        if old == record:
            return  # nothing a decision reads changed (a condition's timestamp, say)
        for key in {r[0] for r in (old, record) if r is not None}:
            self._wake_pod(key)

    def _replace_slices(self, records: Mapping[str, SliceRecord]) -> None:
        with self._lock:
            old, self._slices = self._slices, dict(records)
            self._service_states = {}
            for record in self._slices.values():
                self._count_slice(record, 1)
        self._wake_all({key for key, _ in set(old.values()) ^ set(records.values())})

    def _put_slice(self, name: str, record: SliceRecord | None) -> None:
        with self._lock:
            old = self._slices.pop(name, None)
            if old is not None:
                self._count_slice(old, -1)
            if record is not None:
                self._slices[name] = record
                self._count_slice(record, 1)
        self._wake_all({r[0] for r in (old, record) if r is not None and old != record})

    def _count_slice(self, record: SliceRecord, change: int) -> None:
        """Under the lock."""
        key, state = record
        states = self._service_states.setdefault(key, Counter())
        states[state] += change
        if states[state] <= 0:
            del states[state]
        if not states:
            del self._service_states[key]

    def _wake_all(self, keys: Iterable[JobKey]) -> None:
        for key in keys:
            self._wake(key)


def _departure_handler(
    on_departure: Departure,
) -> Callable[[str, Deleted[tuple[JobKey, WorkerPod]]], None]:
    def departed(_: str, deleted: Deleted[tuple[JobKey, WorkerPod]]) -> None:
        # A tombstone's state is the last one seen before the gap, not the final one.
        # It is still the best evidence there is of why the worker went (its rank and
        # attempt; an exit code or DisruptionTarget seen before the gap): without it the
        # failure policy would judge a worker that vanished for no known reason.
        record = deleted.obj if isinstance(deleted, DeletedFinalStateUnknown) else deleted
        on_departure(*record)

    return departed


def _owner_key(obj: Mapping[str, Any]) -> JobKey | None:
    meta = obj.get("metadata") or {}
    job = (meta.get("labels") or {}).get(contract.LABEL_JOB_NAME)
    return (str(meta.get("namespace", "")), str(job)) if job else None


def _split(name: str) -> JobKey:
    namespace, _, job = name.partition("/")
    return namespace, job


def _version(body: Body | None) -> str | None:
    return None if body is None else str((body.get("metadata") or {}).get("resourceVersion"))
