"""Every call the operator makes to the API server, in one place.

Blocking calls of the official client; the reconciler runs them in threads.
Worker pods are created (POST, strict field validation), other children written
with server-side apply, all under one field manager; status with a merge patch
that carries the resourceVersion it was computed from, so a decision made on a
stale view is refused (409) instead of applied.
"""

import base64
import json
import logging
import os
import socket
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from trainwave import contract, signatures
from trainwave.controller.api_errors import (
    Conflict,
    Refused,
    Rejected,
    malformed,
    refusal,
    status_message,
    undecodable,
)
from trainwave.lifecycle.decide import JobEvent

logger = logging.getLogger(__name__)

APPLY = "application/apply-patch+yaml"
MERGE = "application/merge-patch+json"
# Pods that hold nothing are left out of the listings placement needs.
ACTIVE_PODS = "status.phase!=Succeeded,status.phase!=Failed"
# How kube-controller-manager's endpoints controller marks the Endpoints it writes
# (k8s.io/kubernetes pkg/controller/endpoint, LabelManagedBy / ControllerName).
ENDPOINTS_MANAGED_BY_LABEL = "endpoints.kubernetes.io/managed-by"
ENDPOINTS_CONTROLLER = "endpoint-controller"


def load_config(pool_size: int) -> client.ApiClient:
    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException:
        config.load_kube_config()  # type: ignore[no-untyped-call]
    configuration = client.Configuration.get_default_copy()
    configuration.connection_pool_maxsize = pool_size
    return client.ApiClient(configuration)


class KubeClient:
    def __init__(self, api_client: client.ApiClient):
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.events = client.EventsV1Api(api_client)
        self.resource = client.ResourceV1Api(api_client)
        self.admission = client.AdmissionregistrationV1Api(api_client)
        self.discovery = client.DiscoveryV1Api(api_client)
        self.instance = os.environ.get("POD_NAME") or socket.gethostname()
        # Asked before every write: with leader election, it refuses a replica that does
        # not hold the Lease (leadership.LeaderElector.check). Reads are never gated.
        self.guard: Callable[[], None] = lambda: None

    def patch_job_status(
        self, namespace: str, name: str, resource_version: str, status: dict[str, Any]
    ) -> dict[str, Any]:
        patch = {"metadata": {"resourceVersion": resource_version}, "status": status}
        self.guard()
        try:
            body: Any = self.custom.patch_namespaced_custom_object_status(
                contract.GROUP, contract.VERSION, namespace, contract.PLURAL, name, patch
            )
        except ApiException as error:
            if error.status in (404, 409):
                raise Conflict(f"{namespace}/{name} changed: {error.reason}") from None
            raise
        return dict(body)

    def note_preemption(self, namespace: str, name: str, preemptor: str, attempt: int) -> None:
        """status.preemptedBy on a victim job, before its pods go; no resourceVersion: the
        field is the placer's alone, and the job's reconcile carries it until it acts."""
        patch = {"status": {"preemptedBy": {"preemptor": preemptor, "attempt": attempt}}}
        self._ignore_gone(
            lambda: _release(
                self.custom.patch_namespaced_custom_object_status(
                    contract.GROUP,
                    contract.VERSION,
                    namespace,
                    contract.PLURAL,
                    name,
                    patch,
                    _preload_content=False,
                )
            )
        )

    def delete_job(self, namespace: str, name: str, uid: str) -> None:
        # The uid precondition keeps a TTL from deleting a newer job of the same name.
        options = client.V1DeleteOptions(
            propagation_policy="Background", preconditions=client.V1Preconditions(uid=uid)
        )
        self._ignore_gone(
            self.custom.delete_namespaced_custom_object,
            contract.GROUP,
            contract.VERSION,
            namespace,
            contract.PLURAL,
            name,
            body=options,
        )

    def apply_service(self, service: dict[str, Any]) -> str:
        """Apply the job's Service; its UID, which its EndpointSlice names as owner."""
        meta = service["metadata"]
        answer = self._apply(
            self.core.patch_namespaced_service, meta["name"], meta["namespace"], service
        )
        return str(json.loads(answer).get("metadata", {}).get("uid", ""))

    def apply_endpoint_slice(self, endpoints: dict[str, Any]) -> None:
        meta = endpoints["metadata"]
        self._apply(
            self.discovery.patch_namespaced_endpoint_slice,
            meta["name"],
            meta["namespace"],
            endpoints,
        )

    def create_pod(self, pod: dict[str, Any]) -> None:
        """Create a worker pod, as kube-controller-manager's controllers create theirs: a
        POST cost kube-apiserver about 40 % less CPU than a server-side apply
        (docs/benchmarks/api-costs.md, "A worker pod write").

        `fieldValidation=Strict` refuses what an apply refused (an undeclared field, a wrong
        type), instead of dropping it with a warning, and such a refusal is `Rejected`: the
        job's spec cannot run as written. A pod of that name that exists already (409) is
        the job's own when the watch is behind: left alone. Another's (a job deleted and
        created again under the same name, whose old pods still terminate, or a pod someone
        made) is `Refused`, naming it: the job says why it waits and retries with backoff
        until the name is free. A server-side apply took such a pod over."""
        meta = pod["metadata"]
        try:
            self._post_pod(pod)
        except ApiException as error:
            if error.status == 409:
                self._created_already(pod)
                return
            what = f"pod {meta['namespace']}/{meta['name']}"
            refused = refusal(error, what, unreadable=undecodable(error))
            if refused is None:
                raise
            raise refused from None

    def dry_run_pod(self, pod: dict[str, Any]) -> dict[str, Any]:
        """`pod` as the API server would store it, admission webhooks included, from a
        server-side dry run of its create: nothing is stored. Raises ApiException when
        it would be refused (or a webhook does not support dry runs)."""
        stored: dict[str, Any] = json.loads(self._post_pod(pod, dry_run="All"))
        return stored

    def _post_pod(self, pod: dict[str, Any], **options: str) -> bytes:
        """POST `pod` as trainwave's field manager, strictly validated; the answer's body."""
        self.guard()
        answer = _CREATE_POD_UNVALIDATED(
            self.core,
            pod["metadata"]["namespace"],
            pod,
            field_manager=contract.FIELD_MANAGER,
            field_validation="Strict",
            _preload_content=False,
            **options,
        )
        return _release(answer)

    def _created_already(self, pod: dict[str, Any]) -> None:
        """After a 409: return if the pod of that name is owned as `pod` would be (ours,
        the watch behind), else raise Refused naming whose it is."""
        meta = pod["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        wanted = {o["uid"] for o in meta.get("ownerReferences") or ()}
        # A list by name, not a get: the operator's role lists and watches pods, no more.
        listed = self.core.list_namespaced_pod(
            namespace, field_selector=f"metadata.name={name}", _preload_content=False
        )
        found = next(iter(json.loads(_release(listed)).get("items") or ()), None)
        if found is None:
            raise Refused(f"pod {namespace}/{name}", "a pod of that name has just gone; retried")
        owners = found["metadata"].get("ownerReferences") or ()
        if wanted <= {o.get("uid") for o in owners}:
            return
        holder = ", ".join(f"{o.get('kind')} {o.get('name')} (uid {o.get('uid')})" for o in owners)
        going = found["metadata"].get("deletionTimestamp")
        raise Refused(
            f"pod {namespace}/{name}",
            "a pod of that name exists already"
            + (f", owned by {holder}" if holder else ", owned by nothing")
            + (", terminating" if going else "")
            + "; created once the name is free",
        )

    def pod_events(self, namespace: str, uid: str) -> list[dict[str, Any]]:
        """The Events on object `uid`, as the kubelet writes them (core API). Only words for
        a job's message: a slow API server gives up after a few seconds rather than holding
        the reconcile that asked."""
        listed = self.core.list_namespaced_event(
            namespace,
            field_selector=f"involvedObject.uid={uid}",
            _request_timeout=5.0,
            _preload_content=False,
        )
        return _items(listed)

    def create_secret(self, secret: Any) -> None:
        """Create once; one that exists already is left alone (its name holds the job's UID,
        and the operator never trusts its content: it derives the key it verifies with)."""
        meta = secret["metadata"]
        self.guard()
        try:
            _release(
                self.core.create_namespaced_secret(
                    meta["namespace"],
                    secret,
                    field_manager=contract.FIELD_MANAGER,
                    _preload_content=False,
                )
            )
        except ApiException as error:
            if error.status == 409:
                return
            what = f"secret {meta['namespace']}/{meta['name']}"
            refused = refusal(error, what, unreadable=False)
            if refused is None:
                raise
            raise refused from None

    def master_status_key(self, namespace: str, name: str) -> bytes:
        """The operator's master status key: read, or created on the first start. Two
        replicas starting together agree: the one whose create loses (409) reads the other's."""
        for _ in range(3):
            try:
                found = self.core.read_namespaced_secret(name, namespace)
            except ApiException as error:
                if error.status != 404:
                    raise
            else:
                try:
                    data: Any = found.data
                    text = base64.b64decode(data[contract.STATUS_KEY_FILE]).decode()
                    return signatures.key_from_text(text)
                except (KeyError, TypeError, ValueError) as error:
                    raise RuntimeError(
                        f"secret {namespace}/{name}: data.{contract.STATUS_KEY_FILE} must hold "
                        f"{signatures.KEY_BYTES} bytes as hex ({error}); delete it to start afresh"
                    ) from None
            key = signatures.new_master_key()
            body: Any = {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": name, "namespace": namespace},
                "type": "Opaque",
                "stringData": {contract.STATUS_KEY_FILE: signatures.key_to_text(key)},
            }
            try:
                self.core.create_namespaced_secret(namespace, body, _preload_content=False)
                logger.info("created the master status key in secret %s/%s", namespace, name)
                return key
            except ApiException as error:
                if error.status != 409:
                    raise
        raise RuntimeError(f"secret {namespace}/{name}: neither readable nor creatable")

    def patch_pod(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        """A merge patch; one that carries a stale resourceVersion raises Conflict."""
        self.guard()
        try:
            _release(
                self.core.patch_namespaced_pod(
                    name,
                    namespace,
                    patch,
                    field_manager=contract.FIELD_MANAGER,
                    _content_type=MERGE,
                    _preload_content=False,
                )
            )
        except ApiException as error:
            if error.status in (404, 409):
                raise Conflict(f"pod {namespace}/{name} changed: {error.reason}") from None
            if error.status == 422:
                raise Rejected(status_message(error)) from None
            raise

    def annotate_node(self, name: str, annotations: dict[str, str]) -> None:
        """A merge patch of the node's annotations; a node already gone is left alone."""
        patch = {"metadata": {"annotations": annotations}}
        self._ignore_gone(
            lambda: _release(
                self.core.patch_node(
                    name,
                    patch,
                    field_manager=contract.FIELD_MANAGER,
                    _content_type=MERGE,
                    _preload_content=False,
                )
            )
        )

    def create_gpu_claim(self, claim: dict[str, Any]) -> None:
        """Create a shared worker's ResourceClaim (builders/sharing.py build_gpu_claim).

        One left by an earlier pod of the same name, or asking for another GPU, is
        deleted and Conflict raised: claims are immutable, and the next round creates
        it afresh. Our own from a release that was retried is kept.
        """
        meta = claim["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        raw: Any = claim  # sent as is: the client's models drop fields they predate
        self.guard()
        try:
            _release(
                self.resource.create_namespaced_resource_claim(
                    namespace, raw, field_manager=contract.FIELD_MANAGER, _preload_content=False
                )
            )
            return
        except ApiException as error:
            if error.status == 422:
                raise Rejected(status_message(error)) from None
            if error.status in (403, 404):
                raise Rejected(
                    f"resourceclaim {namespace}/{name}: {status_message(error)} (the operator "
                    "needs create, get and delete on resource.k8s.io/v1 resourceclaims, "
                    "Kubernetes 1.34 or newer)"
                ) from None
            if error.status != 409:
                raise
        response: Any = self.resource.read_namespaced_resource_claim(
            name, namespace, _preload_content=False
        )
        existing = json.loads(response.data)
        if _selectors(existing) == _selectors(claim) and _same_owner(existing, claim):
            return
        self._ignore_gone(
            lambda: _release(
                self.resource.delete_namespaced_resource_claim(
                    name, namespace, _preload_content=False
                )
            )
        )
        raise Conflict(f"resourceclaim {namespace}/{name} was left by an earlier pod; replaced")

    def delete_foreign_slices(self, namespace: str, service: str, ours: str) -> None:
        """Delete the EndpointSlices of `service` that another controller manages (`ours`:
        the operator's managed-by value)."""
        selector = (
            f"kubernetes.io/service-name={service},endpointslice.kubernetes.io/managed-by!={ours}"
        )
        self._ignore_gone(
            lambda: _release(
                self.discovery.delete_collection_namespaced_endpoint_slice(
                    namespace, label_selector=selector, _preload_content=False
                )
            )
        )

    def delete_foreign_endpoints(self, namespace: str, service: str) -> None:
        """Delete the Endpoints kube-controller-manager's endpoints controller wrote for
        `service` while it had a selector. It leaves them when the selector goes, and its
        EndpointSlice mirroring controller then mirrors them, for a Service without a
        selector, into a slice it writes again each time it is deleted
        (k8s.io/kubernetes pkg/controller/endpointslicemirroring, v1.34: only a selector
        or the skip-mirror label, which the endpoints controller no longer sets, stops it)."""
        self._ignore_gone(
            lambda: _release(
                self.core.delete_collection_namespaced_endpoints(
                    namespace,
                    field_selector=f"metadata.name={service}",
                    label_selector=f"{ENDPOINTS_MANAGED_BY_LABEL}={ENDPOINTS_CONTROLLER}",
                    _preload_content=False,
                )
            )
        )

    def delete_service(self, namespace: str, name: str) -> None:
        """Delete a Service; garbage collection takes the EndpointSlices it owns."""
        self._ignore_gone(
            lambda: _release(
                self.core.delete_namespaced_service(name, namespace, _preload_content=False)
            )
        )

    def delete_pod(self, namespace: str, name: str, *, force: bool = False) -> None:
        """`force`: grace period 0, for a pod whose node will never confirm a graceful
        delete (lost or NotReady) and whose name must come free for its replacement."""
        grace = 0 if force else None
        self._ignore_gone(
            lambda: _release(
                self.core.delete_namespaced_pod(
                    name, namespace, grace_period_seconds=grace, _preload_content=False
                )
            )
        )

    def post_event(self, job: dict[str, Any], event: JobEvent, when: datetime) -> None:
        meta = job["metadata"]
        now = when.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")
        # client-go's naming: unique per object and instant, no generateName round trip.
        name = f"{meta['name']}.{time.time_ns():x}"
        body: Any = {
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": meta["namespace"]},
            "eventTime": now,
            "reportingController": contract.REPORTING_CONTROLLER,
            "reportingInstance": self.instance,
            "action": "Reconcile",
            "reason": event.reason,
            "note": event.message[:1024],
            "type": event.type,
            "regarding": {
                "apiVersion": contract.API_VERSION,
                "kind": contract.KIND,
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta["uid"],
            },
        }
        self.guard()
        try:
            _release(
                self.events.create_namespaced_event(meta["namespace"], body, _preload_content=False)
            )
        except ApiException as error:
            # An Event is news, not state: losing one must not stop a reconcile.
            logger.warning(
                "could not post event %s for %s: %s", event.reason, meta["name"], error.reason
            )

    def _apply(self, patch: Any, name: str, namespace: str, body: dict[str, Any]) -> bytes:
        """Apply `body`; the answer's raw JSON."""
        self.guard()
        try:
            response = patch(
                name,
                namespace,
                body,
                field_manager=contract.FIELD_MANAGER,
                force=True,
                _content_type=APPLY,
                # Turning the answer into client models costs more CPU than the request.
                _preload_content=False,
            )
            return _release(response)
        except ApiException as error:
            what = f"{body.get('kind', 'object').lower()} {namespace}/{name}"
            refused = refusal(error, what, unreadable=malformed(error))
            if refused is None:
                raise
            raise refused from None

    def _ignore_gone(self, call: Any, *args: Any, **kwargs: Any) -> None:
        self.guard()
        try:
            call(*args, **kwargs)
        except ApiException as error:
            if error.status not in (404, 409):
                raise


def _release(response: Any) -> bytes:
    """Read an unparsed response to its end and hand its connection back to the pool.

    Without this every call would leave its connection checked out, and the
    next one would pay for a new TLS handshake. Returns the body, unparsed.
    """
    data: bytes = response.read()
    response.release_conn()
    return data


def _items(response: Any) -> list[dict[str, Any]]:
    try:
        items: list[dict[str, Any]] = json.loads(response.data)["items"]
    finally:
        response.release_conn()
    return items


# The client's generated method validates its body as a V1Pod model (pydantic), which
# refuses integer quantities and would drop fields the model predates before the API
# server's strict validation saw them: the function it wraps sends the body as is, as
# the patch methods (typed `object`) do. kubernetes is pinned (pyproject.toml).
_CREATE_POD_UNVALIDATED: Callable[..., Any] = client.CoreV1Api.create_namespaced_pod.__wrapped__  # type: ignore[attr-defined]


def _selectors(claim: dict[str, Any]) -> list[Any]:
    """What pins a claim to its GPU (the server defaults other fields of the spec)."""
    requests = (claim.get("spec") or {}).get("devices", {}).get("requests") or []
    return [(r.get("exactly") or {}).get("selectors") for r in requests]


def _same_owner(existing: dict[str, Any], wanted: dict[str, Any]) -> bool:
    owners = {o.get("uid") for o in existing["metadata"].get("ownerReferences") or ()}
    return all(o["uid"] in owners for o in wanted["metadata"].get("ownerReferences") or ())
