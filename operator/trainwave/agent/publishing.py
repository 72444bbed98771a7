"""Publishing a `DesiredNode` to the agent's own Node: the agent's only API calls.

Read the Node, diff (`changes.py`), and send at most two JSON merge patches:
labels and annotations to the node, owned extended resources to nodes/status.
Nothing is sent when nothing changed. Every API failure becomes a
`PublishError` whose message says what was refused and what to check; the
caller logs it and tries again on the next pass.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from functools import partial
from typing import Any

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from trainwave.agent.changes import Change, DesiredNode, diff_node
from trainwave.agent.slices import NodeRef, gate_problem, plan_slices
from trainwave.contract import AGENT_FIELD_MANAGER, DRA_DRIVER, ENV_NODE_NAME
from trainwave.hardware.inventory import GpuInfo

logger = logging.getLogger(__name__)

MERGE_PATCH = "application/merge-patch+json"
REQUEST_TIMEOUT = 15.0  # seconds; a hung API server must not hang the agent's loop
RBAC_HINT = (
    "the agent's ServiceAccount needs get and patch on nodes, patch on nodes/status and, "
    "with --gpu-slices, list, create, update and delete on resourceslices "
    "(chart: templates/agent-rbac.yaml)"
)


class PublishError(RuntimeError):
    """The API server could not be reached or refused a request; the message says why."""


def connect() -> client.CoreV1Api:
    """In a pod, the ServiceAccount; elsewhere, $KUBECONFIG or ~/.kube/config."""
    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException:
        try:
            config.load_kube_config()  # type: ignore[no-untyped-call]
        except (config.ConfigException, OSError) as error:
            raise PublishError(
                f"no API server credentials: not in a pod, and no usable kubeconfig ({error})"
            ) from error
    return client.CoreV1Api(client.ApiClient(client.Configuration.get_default_copy()))


class NodePublisher:
    def __init__(self, core: client.CoreV1Api, node_name: str) -> None:
        self.core = core
        self.resources = client.ResourceV1Api(core.api_client)
        self.node_name = node_name

    def publish(self, desired: DesiredNode) -> tuple[Change, ...]:
        node = self._call("get", "nodes", self._read)
        slice_changes = self._publish_slices(node, desired.slices)
        patches = diff_node(node, desired)
        if patches.node:
            self._call("patch", "nodes", lambda: self._patch(self.core.patch_node, patches.node))
        if patches.status:
            self._call(
                "patch",
                "nodes/status",
                lambda: self._patch(self.core.patch_node_status, patches.status),
            )
        for change in patches.changes:
            logger.info("node=%s %s", self.node_name, change)
        return (*slice_changes, *patches.changes)

    def _publish_slices(
        self, node: dict[str, Any], shared: tuple[GpuInfo, ...] | None
    ) -> tuple[Change, ...]:
        """Create, replace or delete this node's ResourceSlices of our driver (slices.py)."""
        if shared is None:
            return ()
        ref = NodeRef(self.node_name, str(node["metadata"]["uid"]))
        published = self._call("list", "resourceslices", self._list_slices)
        plan = plan_slices(ref, shared, published)
        changes: list[Change] = []
        for body in plan.write:
            name = str(body["metadata"]["name"])
            if "resourceVersion" in body["metadata"]:
                replace = partial(
                    self._write_slice, self.resources.replace_resource_slice, name, body
                )
                stored = self._call("replace", "resourceslices", replace)
            else:
                create = partial(self._write_slice, self.resources.create_resource_slice, body)
                stored = self._call("create", "resourceslices", create)
            problem = gate_problem(stored)
            if problem is not None:
                raise PublishError(problem)
            generation = str(body["spec"]["pool"]["generation"])
            changes.append(Change("resourceslice", name, None, f"generation {generation}"))
        for name in plan.delete:
            self._call("delete", "resourceslices", partial(self._delete, name))
            changes.append(Change("resourceslice", name, "published", None))
        for change in changes:
            logger.info("node=%s %s", self.node_name, change)
        return tuple(changes)

    def read_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        """A ResourceClaim for the kubelet plugin's NodePrepareResources; None when gone."""
        try:
            response: Any = self.resources.read_namespaced_resource_claim(
                name, namespace, _preload_content=False, _request_timeout=REQUEST_TIMEOUT
            )
        except ApiException as error:
            if error.status == 404:
                return None
            raise PublishError(self._explain("get", "resourceclaims", error)) from error
        claim: dict[str, Any] = json.loads(response.data)
        return claim

    def _list_slices(self) -> list[dict[str, Any]]:
        response: Any = self.resources.list_resource_slice(
            field_selector=f"spec.nodeName={self.node_name},spec.driver={DRA_DRIVER}",
            _preload_content=False,
            _request_timeout=REQUEST_TIMEOUT,
        )
        items: list[dict[str, Any]] = json.loads(response.data).get("items") or []
        return items

    def _write_slice(self, write: Callable[..., Any], *args: Any) -> dict[str, Any]:
        """Create or replace: the body goes as the API's JSON (the client's models drop
        fields they predate), and the slice comes back as the server stored it."""
        response: Any = write(
            *args,
            field_manager=AGENT_FIELD_MANAGER,
            _preload_content=False,
            _request_timeout=REQUEST_TIMEOUT,
        )
        stored: dict[str, Any] = json.loads(response.data)
        return stored

    def _delete(self, name: str) -> None:
        self.resources.delete_resource_slice(name, _request_timeout=REQUEST_TIMEOUT)

    def _read(self) -> dict[str, Any]:
        # The raw JSON, not the client's model: the diff reads the API's own field names.
        response: Any = self.core.read_node(
            self.node_name, _preload_content=False, _request_timeout=REQUEST_TIMEOUT
        )
        node: dict[str, Any] = json.loads(response.data)
        return node

    def _patch(self, method: Callable[..., Any], body: dict[str, Any]) -> None:
        method(
            self.node_name,
            body,
            field_manager=AGENT_FIELD_MANAGER,
            _content_type=MERGE_PATCH,
            _request_timeout=REQUEST_TIMEOUT,
        )

    def _call(self, verb: str, resource: str, call: Callable[[], Any]) -> Any:
        try:
            return call()
        except ApiException as error:
            raise PublishError(self._explain(verb, resource, error)) from error
        except (urllib3.exceptions.HTTPError, OSError) as error:
            host = self.core.api_client.configuration.host
            raise PublishError(
                f"{verb} {resource}/{self.node_name}: cannot reach the API server at {host}: "
                f"{error}"
            ) from error

    def _explain(self, verb: str, resource: str, error: ApiException) -> str:
        what = f"{verb} {resource}/{self.node_name}"
        message = _server_message(error)
        if error.status == 404 and resource == "resourceslices":
            return (
                f"{what}: not found: {message}; --gpu-slices needs resource.k8s.io/v1 "
                "(Kubernetes 1.34 or newer)"
            )
        if error.status == 404:
            return (
                f"{what}: node not found; --node-name (default ${ENV_NODE_NAME}) must be this "
                f"node's name as the API server knows it"
            )
        if error.status == 401:
            return f"{what}: unauthorized: the agent's credentials were refused: {message}"
        if error.status == 403:
            return f"{what}: forbidden: {RBAC_HINT}; the server said: {message}"
        return f"{what}: HTTP {error.status} {error.reason}: {message}"


def _server_message(error: ApiException) -> str:
    """The `message` of the Status body the API server sends with an error."""
    try:
        status = json.loads(error.body or "")
    except ValueError:
        return (error.body or "").strip() or str(error.reason)
    return str(status.get("message") or error.reason) if isinstance(status, dict) else ""
