"""What the test kubelet runs for a pod, resolved from the Pod body. Pure.

`plan_containers` turns each init container and container into a command
line, an environment and a working directory, the way a kubelet and a
container runtime would: `env` in order with `$(VAR)` expansion and
`valueFrom.fieldRef`, then `$(VAR)` in command and args. Images are not
pulled: the image's filesystem is this machine, and `base_env` stands for
the image's environment. What the test kubelet cannot emulate raises
`Unsupported` naming the field, so the pod fails with that message instead of
running something else.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from e2e.formats import format_map


class Unsupported(ValueError):
    """A pod field the test kubelet does not emulate; the message names it."""


@dataclass(frozen=True)
class Mount:
    volume: str
    path: str
    read_only: bool


@dataclass(frozen=True)
class ContainerPlan:
    name: str
    argv: tuple[str, ...]
    env: dict[str, str]
    cwd: str
    mounts: tuple[Mount, ...]


@dataclass(frozen=True)
class PodContext:
    """What the kubelet knows about the pod beyond its body."""

    ip: str
    host_ip: str
    base_env: Mapping[str, str]


def plan_containers(
    pod: Mapping[str, Any], context: PodContext
) -> tuple[tuple[ContainerPlan, ...], tuple[ContainerPlan, ...]]:
    """(init containers, containers), each in spec order."""
    spec = pod.get("spec") or {}
    init = tuple(
        _plan(c, f"spec.initContainers[{c.get('name')}]", pod, context)
        for c in spec.get("initContainers") or []
    )
    main = tuple(
        _plan(c, f"spec.containers[{c.get('name')}]", pod, context)
        for c in spec.get("containers") or []
    )
    return init, main


def _plan(
    container: Mapping[str, Any], where: str, pod: Mapping[str, Any], context: PodContext
) -> ContainerPlan:
    if container.get("envFrom"):
        raise Unsupported(f"{where}.envFrom: not emulated; use env")
    env = dict(context.base_env)
    hostname = (pod.get("spec") or {}).get("hostname") or pod["metadata"]["name"]
    env["HOSTNAME"] = hostname
    for index, item in enumerate(container.get("env") or []):
        name = item["name"]
        source = item.get("valueFrom")
        if source is None:
            env[name] = expand(item.get("value", ""), env)
        elif "fieldRef" in source:
            env[name] = field_value(source["fieldRef"]["fieldPath"], pod, context)
        else:
            kinds = ", ".join(sorted(source))
            raise Unsupported(
                f"{where}.env[{index}] ({name}).valueFrom.{kinds}: only fieldRef is emulated"
            )
    command = list(container.get("command") or [])
    if not command:
        raise Unsupported(
            f"{where}.command is empty: the test kubelet runs no images, so it cannot know "
            "the image's entrypoint; set command"
        )
    argv = tuple(expand(part, env) for part in [*command, *(container.get("args") or [])])
    mounts = []
    for mount in container.get("volumeMounts") or []:
        if mount.get("subPath") or mount.get("subPathExpr"):
            raise Unsupported(f"{where}.volumeMounts[{mount['name']}].subPath: not emulated")
        mounts.append(Mount(mount["name"], mount["mountPath"], bool(mount.get("readOnly"))))
    return ContainerPlan(
        name=container["name"],
        argv=argv,
        env=env,
        cwd=container.get("workingDir") or "/",
        mounts=tuple(mounts),
    )


_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][-._A-Za-z0-9]*)\)")


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: defined names are replaced, others kept; $$ is $."""

    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if name is None:
            return "$"
        return env.get(name, match.group(0))

    return _REFERENCE.sub(replace, text)


_KEYED_FIELD = re.compile(r"^metadata\.(labels|annotations)\['([^']+)'\]$")


def field_value(path: str, pod: Mapping[str, Any], context: PodContext) -> str:
    """The value of a downward API fieldPath, for env and downwardAPI volumes."""
    metadata = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    simple = {
        "metadata.name": metadata.get("name", ""),
        "metadata.namespace": metadata.get("namespace", ""),
        "metadata.uid": metadata.get("uid", ""),
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", ""),
        "status.podIP": context.ip,
        "status.podIPs": context.ip,
        "status.hostIP": context.host_ip,
        "status.hostIPs": context.host_ip,
    }
    if path in simple:
        return str(simple[path])
    keyed = _KEYED_FIELD.match(path)
    if keyed:
        return str((metadata.get(keyed.group(1)) or {}).get(keyed.group(2), ""))
    accepted = [*simple, "metadata.labels['KEY']", "metadata.annotations['KEY']"]
    raise Unsupported(f"fieldPath {path!r}: not emulated; accepted: {', '.join(accepted)}")


def downward_files(
    items: list[Mapping[str, Any]], pod: Mapping[str, Any], context: PodContext, where: str
) -> dict[str, str]:
    """The files of a downwardAPI volume (or projected source): relative path -> content."""
    metadata = pod.get("metadata") or {}
    files = {}
    for item in items:
        if "resourceFieldRef" in item:
            raise Unsupported(f"{where}.items[{item.get('path')}].resourceFieldRef: not emulated")
        path = item["fieldRef"]["fieldPath"]
        if path in ("metadata.labels", "metadata.annotations"):
            files[item["path"]] = format_map(metadata.get(path.split(".")[1]) or {})
        else:
            files[item["path"]] = field_value(path, pod, context)
    return files
