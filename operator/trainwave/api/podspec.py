"""The shape of a PodSpec fragment (spec.template.spec), checked before any API call. Pure.

The CRD stores spec.template.spec as given (x-kubernetes-preserve-unknown-fields),
so it cannot say that `volumes` is a list of objects. A wrong type there used to
surface in one of two bad ways: a builder raised on it and the reconcile was
retried forever, or server-side apply refused the pod with HTTP 500 ("failed to
create typed patch object", kubernetes/kubernetes#139253), which reads as a
server fault and was retried too. These tables hold the JSON kind of the core/v1
fields trainwave merges into or reads, and of the common ones a user writes, so a
wrong type fails the job once, naming the field path and the value seen.

Fields not listed pass through: the API server still judges them, and a field
added by a later Kubernetes must not be refused here. Values are never null:
the API server prunes nulls from preserved objects, and resolving does the same.
"""

import re
from collections.abc import Mapping
from typing import Any

from trainwave.api.base import QUANTITY_PATTERN

# A shape is one of the kind names below, an object's own table, or a one-item
# list holding the shape of every element.
Shape = str | Mapping[str, Any] | list[Any]

_KINDS = {
    "string": "a string",
    "integer": "an integer",
    "boolean": "true or false",
    "object": "an object",
    "strings": "a list of strings",
    "labels": "a map of strings",
    "quantities": "a map of quantities (e.g. cpu: 500m, memory: 1Gi)",
}

_NAMED = {"name": "string"}
ENV_VAR = {"name": "string", "value": "string", "valueFrom": "object"}
PORT = {
    "name": "string", "containerPort": "integer", "hostPort": "integer",
    "protocol": "string", "hostIP": "string",
}  # fmt: skip
VOLUME_MOUNT = {
    "name": "string", "mountPath": "string", "readOnly": "boolean", "subPath": "string",
    "subPathExpr": "string", "mountPropagation": "string", "recursiveReadOnly": "string",
}  # fmt: skip
RESOURCES = {"requests": "quantities", "limits": "quantities", "claims": [_NAMED]}
CONTAINER_SECURITY = {
    "capabilities": {"add": "strings", "drop": "strings"},
    "privileged": "boolean", "runAsUser": "integer", "runAsGroup": "integer",
    "runAsNonRoot": "boolean", "readOnlyRootFilesystem": "boolean",
    "allowPrivilegeEscalation": "boolean",
}  # fmt: skip
CONTAINER = {
    "name": "string", "image": "string", "imagePullPolicy": "string", "workingDir": "string",
    "command": "strings", "args": "strings", "env": [ENV_VAR], "envFrom": ["object"],
    "ports": [PORT], "volumeMounts": [VOLUME_MOUNT], "volumeDevices": ["object"],
    "resources": RESOURCES, "securityContext": CONTAINER_SECURITY, "restartPolicy": "string",
    "livenessProbe": "object", "readinessProbe": "object", "startupProbe": "object",
    "lifecycle": "object", "stdin": "boolean", "tty": "boolean",
    "terminationMessagePath": "string", "terminationMessagePolicy": "string",
}  # fmt: skip
TOLERATION = {
    "key": "string", "operator": "string", "value": "string", "effect": "string",
    "tolerationSeconds": "integer",
}  # fmt: skip
_REQUIREMENT = {"key": "string", "operator": "string", "values": "strings"}
_TERM = {"matchExpressions": [_REQUIREMENT], "matchFields": [_REQUIREMENT]}
NODE_AFFINITY = {
    "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [_TERM]},
    "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": "integer", "preference": _TERM}],
}
POD_SPEC: Mapping[str, Shape] = {
    "containers": [CONTAINER], "initContainers": [CONTAINER],
    "ephemeralContainers": [CONTAINER], "volumes": [_NAMED], "tolerations": [TOLERATION],
    "nodeSelector": "labels", "schedulingGates": [_NAMED], "imagePullSecrets": [_NAMED],
    "affinity": {"nodeAffinity": NODE_AFFINITY, "podAffinity": "object",
                 "podAntiAffinity": "object"},
    "topologySpreadConstraints": ["object"], "hostAliases": ["object"],
    "readinessGates": ["object"], "resourceClaims": [_NAMED], "resources": RESOURCES,
    "overhead": "quantities", "securityContext": "object", "dnsConfig": "object",
    "os": "object", "serviceAccountName": "string", "serviceAccount": "string",
    "nodeName": "string", "schedulerName": "string", "priorityClassName": "string",
    "runtimeClassName": "string", "dnsPolicy": "string", "restartPolicy": "string",
    "preemptionPolicy": "string", "hostname": "string", "subdomain": "string",
    "priority": "integer", "terminationGracePeriodSeconds": "integer",
    "activeDeadlineSeconds": "integer", "hostNetwork": "boolean", "hostPID": "boolean",
    "hostIPC": "boolean", "hostUsers": "boolean", "shareProcessNamespace": "boolean",
    "automountServiceAccountToken": "boolean", "enableServiceLinks": "boolean",
    "setHostnameAsFQDN": "boolean",
}  # fmt: skip


def shape_problem(value: Any, shape: Shape, path: str) -> str | None:
    """The first place where `value` does not have `shape`, said for a person, or None."""
    if isinstance(shape, list):
        if not isinstance(value, list):
            return _wrong(path, "a list", value)
        for index, item in enumerate(value):
            problem = shape_problem(item, shape[0], f"{path}[{_label(item, index)}]")
            if problem:
                return problem
        return None
    if isinstance(shape, Mapping):
        if not isinstance(value, dict):
            return _wrong(path, "an object", value)
        for key, item in value.items():
            if key in shape:
                problem = shape_problem(item, shape[key], f"{path}.{key}")
                if problem:
                    return problem
        return None
    return None if _is(value, shape) else _wrong(path, _KINDS[shape], value)


def _is(value: Any, kind: str) -> bool:
    if kind == "string":
        return isinstance(value, str)
    if kind == "integer":  # bool is an int in Python, never in JSON
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "object":
        return isinstance(value, dict)
    if kind == "strings":
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    if kind == "labels":
        return isinstance(value, dict) and all(isinstance(v, str) for v in value.values())
    return isinstance(value, dict) and all(_is_quantity(v) for v in value.values())


def _is_quantity(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int | float):
        return True
    return isinstance(value, str) and _QUANTITY.match(value) is not None


_QUANTITY = re.compile(QUANTITY_PATTERN)


def _label(item: Any, index: int) -> str:
    """Containers and other named items are named by name, as a person reads them."""
    name = item.get("name") if isinstance(item, dict) else None
    return name if isinstance(name, str) and name else str(index)


def _wrong(path: str, expected: str, value: Any) -> str:
    seen = repr(value)
    if len(seen) > 60:
        seen = seen[:57] + "..."
    return f"{path} must be {expected} (got {seen})"


def without_nulls(value: Any) -> Any:
    """`value` with null map entries dropped at every depth, as the API server stores it."""
    if isinstance(value, dict):
        return {k: without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [without_nulls(v) for v in value]
    return value
