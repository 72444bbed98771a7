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
from typing import Any

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from trainwave.agent.changes import Change, DesiredNode, diff_node
from trainwave.contract import AGENT_FIELD_MANAGER, ENV_NODE_NAME

logger = logging.getLogger(__name__)

MERGE_PATCH = "application/merge-patch+json"
REQUEST_TIMEOUT = 15.0  # seconds; a hung API server must not hang the agent's loop
RBAC_HINT = (
    "the agent's ServiceAccount needs get and patch on nodes and patch on nodes/status "
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
        self.node_name = node_name

    def publish(self, desired: DesiredNode) -> tuple[Change, ...]:
        node = self._call("get", "nodes", self._read)
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
        return patches.changes

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
