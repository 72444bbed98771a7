"""Kueue's side of queued jobs: the Workloads trainwave owns and the ResourceFlavors
they are admitted to, followed by watches; and the writes trainwave makes to them.

Two informers (kube/informer.py) fill the stores below, as job_cache.py does for jobs
and pods, so a reconcile reads its Workload from memory. A Workload is filed
under the job named by its `trainwave.io/job-name` label and woken when what
decide reads of it (lifecycle/admission.py `Workload`) changes: Kueue's
admission, eviction or a pending message. A flavor change wakes nobody: it
applies to gangs started after it, as in Kueue.

Only built with the operator's --kueue flag, after kueue_api.py has found the
API version the API server serves (`version`): every list, watch and write here
uses it. Without Kueue's CRDs the LISTs would fail and retry forever.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from typing import Any

from kubernetes.client.exceptions import ApiException

from trainwave import contract
from trainwave.api.trainingjob import JobKey
from trainwave.controller.api_errors import Conflict
from trainwave.controller.kube import KubeClient
from trainwave.kube.index import ByOwner
from trainwave.kube.informer import (
    PAGE_SIZE,
    WATCH_SECONDS,
    Informer,
    InformerGroup,
    LockedDict,
    StoreFuncs,
)
from trainwave.kube.namespaced import AnyInformer, informer_in
from trainwave.lifecycle.admission import Flavor, Workload, observe_workload

logger = logging.getLogger(__name__)


def _kueue(version: str) -> tuple[str, str]:
    return contract.KUEUE_GROUP, version


class WorkloadCache(InformerGroup):
    def __init__(
        self,
        kube: KubeClient,
        wake: Callable[[JobKey], None],
        *,
        version: str = contract.KUEUE_VERSION,
        namespaces: Iterable[str] = (),
        page_size: int = PAGE_SIZE,
        watch_seconds: int = WATCH_SECONDS,
    ):
        """`version`: Kueue's API version, as kueue_api.discover_version chose it.
        `namespaces`: the operator's --namespace; with names, Workloads are watched
        only there (kube/namespaced.py). ResourceFlavors are cluster-scoped."""
        self.version = version
        kueue = _kueue(version)
        self._lock = threading.Lock()
        self._wake = wake
        self._workloads: ByOwner[JobKey, Workload] = ByOwner()
        self._flavors = LockedDict[Flavor](self._lock)
        common: dict[str, Any] = {"page_size": page_size, "watch_seconds": watch_seconds}
        custom = kube.custom
        labelled = contract.LABEL_JOB_NAME
        self.workload_informer: AnyInformer[tuple[JobKey, Workload]] = informer_in(
            "workloads",
            namespaces,
            everywhere=partial(
                custom.list_cluster_custom_object,
                *kueue,
                contract.KUEUE_WORKLOADS,
                label_selector=labelled,
            ),
            lister_in=lambda ns: partial(
                custom.list_namespaced_custom_object,
                *kueue,
                ns,
                contract.KUEUE_WORKLOADS,
                label_selector=labelled,
            ),
            convert=_workload_record,
            store=StoreFuncs(self._replace_workloads, self._put_workload),
            **common,
        )
        self.flavor_informer: Informer[Flavor] = Informer(
            "resourceflavors",
            partial(custom.list_cluster_custom_object, *kueue, contract.KUEUE_FLAVORS),
            _flavor_record,
            self._flavors,
            **common,
        )

    @property
    def informers(self) -> tuple[AnyInformer[Any], ...]:
        return self.workload_informer, self.flavor_informer

    def workload(self, key: JobKey, owner_uid: str) -> Workload | None:
        """The job's own Workload; one left by an earlier job of the same name is not it."""
        with self._lock:
            found = self._workloads.of(key)
            return next((w for w in found if w.owner_uid == owner_uid), None)

    def flavors(self, names: Iterable[str]) -> list[Flavor] | None:
        """The named flavors; None while one is not known yet (its watch event will come)."""
        with self._lock:
            found = [self._flavors.records.get(name) for name in names]
        return None if any(f is None for f in found) else [f for f in found if f is not None]

    # Store writes, on informer threads.

    def _replace_workloads(self, records: Mapping[str, tuple[JobKey, Workload]]) -> None:
        with self._lock:
            changed = self._workloads.replace(records)
        for key in changed:
            self._wake(key)

    def _put_workload(self, name: str, record: tuple[JobKey, Workload] | None) -> None:
        with self._lock:
            old = self._workloads.put(name, record)
        if _decided(old) != _decided(record):
            for key in {r[0] for r in (old, record) if r is not None}:
                self._wake(key)


def _decided(record: tuple[JobKey, Workload] | None) -> object:
    """What decide reads of a Workload: its resourceVersion alone would wake the job on
    every write trainwave makes itself."""
    if record is None:
        return None
    key, w = record
    return key, w.owner_uid, w.queue, w.conditions, w.cluster_queue, w.flavors, w.active


def _workload_record(obj: Mapping[str, Any]) -> tuple[JobKey, Workload] | None:
    meta = obj.get("metadata") or {}
    job = (meta.get("labels") or {}).get(contract.LABEL_JOB_NAME)
    workload = observe_workload(obj)
    if not job or workload is None:
        return None
    return (str(meta.get("namespace", "")), str(job)), workload


def _flavor_record(obj: Mapping[str, Any]) -> Flavor | None:
    spec = obj.get("spec") or {}
    return Flavor(
        name=str((obj.get("metadata") or {}).get("name", "")),
        node_labels=dict(spec.get("nodeLabels") or {}),
        tolerations=tuple(dict(t) for t in spec.get("tolerations") or []),
    )


# Writes. Blocking calls, run in the reconciler's threads, gated on the Lease like all writes,
# under trainwave's one field manager (the Workload's managedFields name it and the version).


def create_workload(kube: KubeClient, body: dict[str, Any], *, version: str) -> None:
    """Create once: one that exists already (our watch has not shown it yet) is ours.
    The body (builders/workload.py) has the same fields in every version trainwave
    speaks (kueue_api.py); only its apiVersion is set to the one in use."""
    kube.guard()
    meta = body["metadata"]
    body = {**body, "apiVersion": "/".join(_kueue(version))}
    try:
        _done(
            kube.custom.create_namespaced_custom_object(
                *_kueue(version),
                meta["namespace"],
                contract.KUEUE_WORKLOADS,
                body,
                field_manager=contract.FIELD_MANAGER,
                _preload_content=False,
            )
        )
    except ApiException as error:
        if error.status != 409:
            raise


def set_workload_active(
    kube: KubeClient, namespace: str, name: str, active: bool, *, version: str
) -> None:
    """spec.active, the switch Kueue's users stop a Workload with; trainwave alone sets it."""
    kube.guard()
    try:
        _done(
            kube.custom.patch_namespaced_custom_object(
                *_kueue(version),
                namespace,
                contract.KUEUE_WORKLOADS,
                name,
                {"spec": {"active": active}},
                field_manager=contract.FIELD_MANAGER,
                _preload_content=False,
            )
        )
    except ApiException as error:
        if error.status != 404:
            raise


def patch_workload_status(
    kube: KubeClient,
    namespace: str,
    name: str,
    resource_version: str,
    status: dict[str, Any],
    *,
    version: str,
) -> None:
    """A JSON merge patch of /status guarded by resourceVersion: the conditions list is
    replaced whole, so a write based on a stale read must fail (409) and be decided again.
    (Kueue's jobframework writes the same fields by server-side apply as kueue-admission.)"""
    kube.guard()
    patch = {"metadata": {"resourceVersion": resource_version}, "status": status}
    try:
        _done(
            kube.custom.patch_namespaced_custom_object_status(
                *_kueue(version),
                namespace,
                contract.KUEUE_WORKLOADS,
                name,
                patch,
                field_manager=contract.FIELD_MANAGER,
                _preload_content=False,
            )
        )
    except ApiException as error:
        if error.status in (404, 409):
            raise Conflict(f"workload {namespace}/{name} changed: {error.reason}") from None
        raise


def _done(response: Any) -> None:
    """Read the unparsed response to its end so its connection goes back to the pool."""
    response.read()
    response.release_conn()
