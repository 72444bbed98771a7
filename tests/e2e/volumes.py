"""A pod's volumes on the test kubelet: where each one's files are on this machine.

emptyDir is a directory of the pod's own; hostPath is the path; secret is a
directory of the Secret's keys as files (the job's status key); downwardAPI
is a directory of files kept up to date when the pod's labels or annotations
change (the runtime reads worker env from annotations set after placement);
projected volumes are what ServiceAccount admission adds to every pod (a
bound token from the TokenRequest API, the cluster CA ConfigMap, the
namespace). The sandbox bind-mounts the returned paths at their mountPaths.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kubernetes import client

from e2e.podspec import PodContext, Unsupported, downward_files


class MountPoints:
    """Mount targets that did not exist on this machine, created for pods and removed at the
    end: a bind mount needs its target to exist, and pods share this machine's filesystem."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._created: list[Path] = []

    def ensure(self, target: Path, *, file: bool) -> None:
        with self._lock:
            missing = [p for p in (target, *target.parents) if not p.exists()]
            for path in reversed(missing):
                if path == target and file:
                    path.touch()
                else:
                    path.mkdir()
                self._created.append(path)

    def remove_all(self) -> None:
        with self._lock:
            for path in reversed(self._created):
                # Not empty, or still mounted somewhere: leave it, never force.
                with contextlib.suppress(OSError):
                    path.rmdir() if path.is_dir() else path.unlink()
            self._created.clear()


class PodVolumes:
    def __init__(self, core: client.CoreV1Api, directory: Path) -> None:
        self.core = core
        self.directory = directory
        self._downward: list[tuple[Path, list[dict[str, Any]], str]] = []

    def prepare(self, pod: Mapping[str, Any], context: PodContext) -> dict[str, Path]:
        """Every volume of the pod by name -> the path to bind-mount."""
        return {v["name"]: self._volume(v, pod, context) for v in pod["spec"].get("volumes") or []}

    def refresh(self, pod: Mapping[str, Any], context: PodContext) -> None:
        """Rewrite the downward API files from a newer version of the pod."""
        for directory, items, where in list(self._downward):
            write_files(directory, downward_files(items, pod, context, where))

    def _volume(
        self, volume: Mapping[str, Any], pod: Mapping[str, Any], context: PodContext
    ) -> Path:
        name = volume["name"]
        where = f"spec.volumes[{name}]"
        local = self.directory / name
        if "emptyDir" in volume:
            local.mkdir(parents=True, exist_ok=True)
            return local
        if "hostPath" in volume:
            return _host_path(volume["hostPath"], where)
        if "downwardAPI" in volume:
            self._downward_files(local, volume["downwardAPI"], pod, context, where)
            return local
        if "secret" in volume:
            self._secret_files(local, volume["secret"], pod["metadata"]["namespace"])
            return local
        if "projected" in volume:
            local.mkdir(parents=True, exist_ok=True)
            for index, source in enumerate(volume["projected"].get("sources") or []):
                self._projected(local, source, pod, context, f"{where}.projected.sources[{index}]")
            return local
        kinds = ", ".join(k for k in volume if k != "name")
        raise Unsupported(
            f"{where}: {kinds} volumes are not emulated; "
            "accepted: emptyDir, hostPath, secret, downwardAPI, projected"
        )

    def _secret_files(self, directory: Path, spec: Mapping[str, Any], namespace: str) -> None:
        """The kubelet's way: every key a file; a missing optional Secret an empty directory."""
        directory.mkdir(parents=True, exist_ok=True)
        try:
            found = self.core.read_namespaced_secret(
                spec["secretName"], namespace, _preload_content=False
            )
        except client.ApiException as error:
            if error.status == 404 and spec.get("optional"):
                return
            raise
        data = json.loads(found.data).get("data") or {}
        items = spec.get("items") or [{"key": k, "path": k} for k in data]
        write_files(
            directory, {i["path"]: base64.b64decode(data[i["key"]]).decode() for i in items}
        )

    def _downward_files(
        self,
        directory: Path,
        spec: Mapping[str, Any],
        pod: Mapping[str, Any],
        context: PodContext,
        where: str,
    ) -> None:
        items = spec.get("items") or []
        write_files(directory, downward_files(items, pod, context, where))
        self._downward.append((directory, items, where))

    def _projected(
        self,
        directory: Path,
        source: Mapping[str, Any],
        pod: Mapping[str, Any],
        context: PodContext,
        where: str,
    ) -> None:
        meta = pod["metadata"]
        if "downwardAPI" in source:
            self._downward_files(directory, source["downwardAPI"], pod, context, where)
        elif "configMap" in source:
            ref = source["configMap"]
            found = self.core.read_namespaced_config_map(
                ref["name"], meta["namespace"], _preload_content=False
            )
            data = json.loads(found.data).get("data") or {}
            items = ref.get("items") or [{"key": k, "path": k} for k in data]
            write_files(directory, {i["path"]: data[i["key"]] for i in items})
        elif "serviceAccountToken" in source:
            token = source["serviceAccountToken"]
            bound = {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"]}
            request = {
                "spec": {
                    "audiences": [token["audience"]] if token.get("audience") else [],
                    "expirationSeconds": token.get("expirationSeconds", 3600),
                    "boundObjectRef": bound,
                }
            }
            account = pod["spec"].get("serviceAccountName") or "default"
            answer = self.core.create_namespaced_service_account_token(
                account, meta["namespace"], request, _preload_content=False
            )
            write_files(directory, {token["path"]: json.loads(answer.data)["status"]["token"]})
        else:
            kinds = ", ".join(source)
            raise Unsupported(
                f"{where}: {kinds}: accepted: downwardAPI, configMap, serviceAccountToken"
            )


def _host_path(spec: Mapping[str, Any], where: str) -> Path:
    path, kind = Path(spec["path"]), spec.get("type", "")
    if kind in ("", "DirectoryOrCreate"):
        path.mkdir(parents=True, exist_ok=True)
    elif kind not in ("Directory", "File"):
        raise Unsupported(
            f"{where}.hostPath.type {kind!r}: accepted: '', DirectoryOrCreate, Directory, File"
        )
    elif not path.exists():
        raise Unsupported(f"{where}.hostPath: {path} does not exist (type {kind})")
    return path


def write_files(directory: Path, files: Mapping[str, str]) -> None:
    """Each file replaced atomically, so a reader never sees half of one."""
    for relative, content in files.items():
        target = directory / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        temporary = target.with_name(f".{target.name}.tmp")
        temporary.write_text(content)
        os.replace(temporary, target)
