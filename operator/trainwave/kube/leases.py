"""The Lease leader election reads and writes, over the official client.

client-go's LeaseLock (k8s.io/client-go tools/leaderelection/resourcelock/leaselock.go):
Get, Create and Update of one coordination.k8s.io/v1 Lease, the update carrying the
resourceVersion that was read so that of two writers one gets 409 (Conflict) and
reads again. Each request is bounded by the timeout leadership.py gives it.
"""

from __future__ import annotations

import json
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from trainwave.kube.leadership import Conflict as LeaseConflict
from trainwave.kube.leadership import LeaseRecord


class LeaseClient:
    """The one Lease leader election uses, over its own connection (see leadership.py)."""

    def __init__(self, api_client: client.ApiClient, namespace: str, name: str):
        self.coordination = client.CoordinationV1Api(api_client)
        self.namespace = namespace
        self.name = name

    def get(self, timeout: float) -> LeaseRecord | None:
        try:
            response = self.coordination.read_namespaced_lease(
                self.name, self.namespace, _preload_content=False, _request_timeout=timeout
            )
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        return _lease_record(_body(response))

    def create(self, record: LeaseRecord, timeout: float) -> LeaseRecord:
        try:
            response = self.coordination.create_namespaced_lease(
                self.namespace, self._body(record), _preload_content=False,
                _request_timeout=timeout,
            )  # fmt: skip
        except ApiException as error:
            if error.status == 409:
                raise LeaseConflict(f"lease {self.namespace}/{self.name} exists") from None
            raise
        return _lease_record(_body(response))

    def update(self, record: LeaseRecord, timeout: float) -> LeaseRecord:
        try:
            response = self.coordination.replace_namespaced_lease(
                self.name, self.namespace, self._body(record), _preload_content=False,
                _request_timeout=timeout,
            )  # fmt: skip
        except ApiException as error:
            if error.status == 409:
                raise LeaseConflict(f"lease {self.namespace}/{self.name} changed") from None
            raise
        return _lease_record(_body(response))

    def _body(self, record: LeaseRecord) -> Any:  # a dict; the client accepts it for V1Lease
        meta: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if record.resource_version:
            # Optimistic concurrency: the update is refused (409) if anyone wrote since.
            meta["resourceVersion"] = record.resource_version
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": meta,
            "spec": {
                "holderIdentity": record.holder,
                "leaseDurationSeconds": record.duration_seconds,
                "acquireTime": record.acquire_time,
                "renewTime": record.renew_time,
                "leaseTransitions": record.transitions,
            },
        }


def _body(response: Any) -> dict[str, Any]:
    try:
        found: dict[str, Any] = json.loads(response.data)
    finally:
        response.release_conn()
    return found


def _lease_record(lease: dict[str, Any]) -> LeaseRecord:
    spec = lease.get("spec") or {}
    return LeaseRecord(
        holder=spec.get("holderIdentity") or "",
        duration_seconds=int(spec.get("leaseDurationSeconds") or 0),
        acquire_time=spec.get("acquireTime") or "",
        renew_time=spec.get("renewTime") or "",
        transitions=int(spec.get("leaseTransitions") or 0),
        resource_version=lease["metadata"].get("resourceVersion", ""),
    )
