"""The gang gate: pods wait behind a scheduling gate until the whole gang has a place. Pure.

Every worker pod is created with the `trainwave.io/placement` scheduling gate, so
kube-scheduler leaves it alone. When the placement engine has found room for
the whole gang, the operator patches each pod once: it narrows the pod's
required node affinity to the chosen node, records the node and the env that
depends on it as annotations, and removes the gate. The API server allows
exactly these changes on a gated pod (affinity may only be added or narrowed)
and nothing of the kind afterwards, which is why a gang that fails to bind is
re-planned with new pods rather than re-pointed.
"""

import copy
import json
from collections.abc import Mapping
from typing import Any

from trainwave import contract
from trainwave.builders.worker import Worker

# Matching the node by name (a field) needs no label on the node.
_NODE_NAME_FIELD = "metadata.name"


def set_scheduling_gate(pod: dict[str, Any], _worker: Worker) -> None:
    gates: list[dict[str, str]] = pod["spec"].setdefault("schedulingGates", [])
    if not any(g.get("name") == contract.SCHEDULING_GATE for g in gates):
        gates.append({"name": contract.SCHEDULING_GATE})


def is_gated(pod: Mapping[str, Any]) -> bool:
    gates = (pod.get("spec") or {}).get("schedulingGates") or []
    return any(g.get("name") == contract.SCHEDULING_GATE for g in gates)


def build_release_patch(
    pod: Mapping[str, Any],
    node: str | None,
    annotations: Mapping[str, str],
    worker_env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A JSON merge patch that pins `pod` to `node` (None: anywhere) and lifts our gate.

    It carries the pod's resourceVersion: if the pod changed since it was read,
    the API server refuses the patch and the gang is tried again next round.
    """
    spec = pod.get("spec") or {}
    metadata = pod.get("metadata") or {}
    gates = [
        g for g in spec.get("schedulingGates") or [] if g.get("name") != contract.SCHEDULING_GATE
    ]
    notes = dict(annotations)
    if node is not None:
        notes[contract.ANNOTATION_PLACED_NODE] = node
    if worker_env:
        notes[contract.ANNOTATION_WORKER_ENV] = json.dumps(dict(worker_env), sort_keys=True)
    patch: dict[str, Any] = {
        "metadata": {"resourceVersion": metadata.get("resourceVersion"), "annotations": notes},
        # A merge patch replaces lists whole: other controllers' gates are kept.
        "spec": {"schedulingGates": gates or None},
    }
    if node is not None:
        patch["spec"]["affinity"] = {"nodeAffinity": _pinned_node_affinity(spec, node)}
    return patch


def _pinned_node_affinity(spec: Mapping[str, Any], node: str) -> dict[str, Any]:
    """The pod's node affinity with every required term narrowed to `node`.

    Terms are ORed, requirements inside a term ANDed: adding the node to each
    term keeps the user's constraints and allows only the chosen node.
    """
    affinity = copy.deepcopy(((spec.get("affinity") or {}).get("nodeAffinity")) or {})
    required = affinity.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    terms = required.get("nodeSelectorTerms") or [{}]
    pin = {"key": _NODE_NAME_FIELD, "operator": "In", "values": [node]}
    required["nodeSelectorTerms"] = [
        {**term, "matchFields": [*term.get("matchFields", []), pin]} for term in terms
    ]
    return affinity


def merged(pod: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """`pod` with a JSON merge patch (RFC 7386) applied, as the API server would: a pod
    placed before it exists is created as its release patch would leave it."""
    result = copy.deepcopy(dict(pod))  # once: the merge below writes into this copy only
    _merge_into(result, patch)
    return result


def _merge_into(target: dict[str, Any], patch: Mapping[str, Any]) -> None:
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, Mapping):
            current = target.get(key)
            if not isinstance(current, dict):  # a patch object replaces a non-object
                target[key] = dict(current) if isinstance(current, Mapping) else {}
            _merge_into(target[key], value)
        else:
            target[key] = copy.deepcopy(value)
