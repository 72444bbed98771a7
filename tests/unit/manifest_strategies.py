"""Hypothesis strategies for TrainingJob specs: valid ones, then broken on purpose.

`specs()` draws a spec a user could write (small gangs, every optional block
now and then, a pod template with containers, volumes, tolerations, affinity),
then applies up to three mutations anywhere in it, the pod template most of
the time: a value replaced by arbitrary JSON (wrong types included), a key
removed, an unknown key added, a value wrapped in a list. The unit fuzz feeds
the result to the operator's pure core; the integration fuzz to the API server.
"""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import strategies as st

IMAGE = "trainwave/test-worker:1"

_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-3, 70_000)
    | st.floats(-1e3, 1e3, allow_nan=False)
    | st.sampled_from(["", "oops", "1Gi", "500m", "worker", "Never", "RANK", "/data"])
    | st.text(max_size=6)
)
JSON = st.recursive(
    _SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(["name", "value", "x", "spec", "items"]), inner, max_size=3
        )
    ),
    max_leaves=6,
)
_QUANTITIES = st.dictionaries(
    st.sampled_from(["cpu", "memory"]), st.sampled_from(["1", "500m", "2Gi", 1]), max_size=2
)
_ENV_NAMES = st.sampled_from(["A", "NCCL_DEBUG", "PYTHONPATH", "LR", "RANK"])  # RANK is reserved


def _env() -> st.SearchStrategy[list[dict[str, Any]]]:
    return st.lists(
        st.fixed_dictionaries({"name": _ENV_NAMES, "value": st.sampled_from(["1", "x", ""])}),
        max_size=3,
        unique_by=lambda e: e["name"],
    )


def _container(name: str) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {"name": st.just(name)},
        optional={
            "image": st.just("busybox:1"),
            "env": _env(),
            "ports": st.just([{"name": "metrics", "containerPort": 9090}]),
            "volumeMounts": st.just([{"name": "data", "mountPath": "/data"}]),
            "resources": st.fixed_dictionaries({}, optional={"requests": _QUANTITIES,
                                                             "limits": _QUANTITIES}),
            "securityContext": st.just({"capabilities": {"add": ["SYS_PTRACE"]}}),
        },
    )  # fmt: skip


_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
_AFFINITY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "kubernetes.io/os", "operator": "In",
                                       "values": ["linux"]}]}
            ]
        }
    }
}  # fmt: skip


def _template_spec() -> st.SearchStrategy[dict[str, Any]]:
    containers = st.lists(st.sampled_from(["worker", "sidecar"]), unique=True, max_size=2).flatmap(
        lambda names: st.tuples(*(_container(n) for n in names)).map(list)
    )
    return st.fixed_dictionaries(
        {},
        optional={
            "containers": containers,
            "volumes": st.just([{"name": "data", "emptyDir": {}}]),
            "tolerations": st.just([_TOLERATION]),
            "nodeSelector": st.just({"kubernetes.io/os": "linux"}),
            "affinity": st.just(_AFFINITY),
            "restartPolicy": st.sampled_from(["Never", "Always"]),
            "terminationGracePeriodSeconds": st.integers(0, 30),
            "priorityClassName": st.just(""),
        },
    )


_RULE = {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [3]}}
_OPTIONAL_SPEC = {
    "processesPerWorker": st.integers(1, 4),
    "command": st.just(["python", "train.py"]),
    "args": st.lists(st.sampled_from(["--lr", "0.1", "--steps=10"]), max_size=3),
    "env": _env(),
    "resources": st.fixed_dictionaries({}, optional={"requests": _QUANTITIES}),
    "masterPort": st.integers(1024, 65535),
    "runPolicy": st.fixed_dictionaries(
        {},
        optional={
            "failurePolicy": st.fixed_dictionaries(
                {}, optional={"maxRestarts": st.integers(0, 3), "rules": st.just([_RULE])}
            ),
            "successPolicy": st.sampled_from(["AllWorkers", "Rank0"]),
            "activeDeadlineSeconds": st.integers(60, 600),
            "ttlSecondsAfterFinished": st.integers(300, 900),
        },
    ),
    "placement": st.fixed_dictionaries(
        {},
        optional={
            "priority": st.integers(-10, 10),
            "preferredLevel": st.sampled_from(["rack", "spine", "host"]),
            "preemptible": st.booleans(),
        },
    ),
    "network": st.sampled_from([{"shmSize": "1Gi"}, {"socketInterface": "eth0"}]),
    "runtime": st.sampled_from([{}, {"enabled": False}, {"features": {"amp": "on"}}]),
}


def valid_specs(annotations: dict[str, str] | None = None) -> st.SearchStrategy[dict[str, Any]]:
    """Specs as a user writes them; `annotations` go on every worker pod (the simulated
    kubelet reads how a pod ends from them)."""
    required = {
        "workers": st.integers(1, 2),
        "gpusPerWorker": st.integers(0, 1),
        "image": st.just(IMAGE),
        "template": st.fixed_dictionaries(
            {"metadata": st.just({"annotations": dict(annotations or {})}),
             "spec": _template_spec()}
        ),
    }  # fmt: skip
    return st.fixed_dictionaries(required, optional=_OPTIONAL_SPEC)


MUTATIONS = ("replace", "delete", "add", "wrap")


@st.composite
def specs(draw: st.DrawFn, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """A valid spec with 0-3 mutations; four in five of them inside the pod template."""
    # A copy: st.just() hands out the same objects every time, and mutating them in
    # place would change later draws (hypothesis then calls the strategy flaky).
    spec = copy.deepcopy(draw(valid_specs(annotations)))
    for _ in range(draw(st.integers(0, 3))):
        # (Once an earlier mutation removed the template, anywhere will do.)
        inside_template = draw(st.integers(0, 4)) > 0 and "template" in spec
        root: Any = spec["template"] if inside_template else spec
        prefix = ("template",) if inside_template else ()
        paths = list(_paths(root))
        path = paths[draw(st.integers(0, len(paths) - 1))]
        mutate(spec, prefix + path, draw(st.sampled_from(MUTATIONS)), draw(JSON))
    return spec


def _paths(node: Any, here: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in `node` a mutation may hit; () is `node` itself."""
    found = [here]
    items = (
        node.items()
        if isinstance(node, dict)
        else enumerate(node)
        if isinstance(node, list)
        else ()
    )
    for key, child in items:
        found.extend(_paths(child, (*here, key)))
    return found


def mutate(spec: dict[str, Any], path: tuple[Any, ...], how: str, value: Any) -> None:
    if not path:
        return  # the spec itself stays an object; its members are mutated instead
    *parents, last = path
    parent: Any = spec
    for key in parents:
        parent = parent[key]
    if how == "replace":
        parent[last] = value
    elif how == "delete":
        del parent[last]
    elif how == "wrap":
        parent[last] = [copy.deepcopy(parent[last])]
    elif isinstance(parent[last], dict):  # add an unknown key
        parent[last]["fuzzField"] = value
    else:
        parent[last] = {"fuzzField": value}
