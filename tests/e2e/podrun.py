"""One pod on the test kubelet: its volumes, its sandbox process, its status.

A `PodRun` owns a directory (logs, emptyDirs, downward API files, the hosts
file, a private TMPDIR) and one thread: it resolves the pod (podspec.py),
prepares its volumes (volumes.py), starts sandbox.py in fresh UTS, mount and PID namespaces, turns the
sandbox's container events into pod status (podstatus.py) and, when the pod
was deleted, removes it with grace period 0 once its processes are gone,
which is a kubelet's last word on a pod.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from e2e.formats import PodAddress
from e2e.nodes import NODE_IP, now_rfc3339
from e2e.podspec import ContainerPlan, PodContext, Unsupported, plan_containers
from e2e.podstatus import START_ERROR_EXIT_CODE, PodState
from e2e.volumes import MountPoints, PodVolumes

logger = logging.getLogger(__name__)

SANDBOX = Path(__file__).resolve().parent / "sandbox.py"
NAMESPACES = ["unshare", "--uts", "--mount", "--propagation", "private", "--pid", "--kill-child"]
# If the kubelet dies, its sandboxes die with it (and with them, their PID namespaces).
ORPHAN_GUARD = ["setpriv", "--pdeathsig", "KILL"]
KILLED_EXIT_CODE = 128 + signal.SIGKILL


def sandbox_unavailable() -> str | None:
    """Why pods cannot run as local processes here, or None when they can."""
    missing = [tool for tool in (NAMESPACES[0], ORPHAN_GUARD[0]) if shutil.which(tool) is None]
    if missing:
        return f"no {' or '.join(missing)} on PATH (util-linux): pods run in namespaces"
    probe = [*NAMESPACES, "--", "true"]
    try:
        result = subprocess.run(probe, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"`{' '.join(probe)}` failed: {error}"
    if result.returncode != 0:
        return (
            f"`{' '.join(probe)}` failed ({result.stderr.strip() or result.returncode}): "
            "creating namespaces needs root (or CAP_SYS_ADMIN)"
        )
    return None


@dataclass(frozen=True)
class Host:
    """What every pod of the kubelet shares."""

    core: client.CoreV1Api
    workdir: Path
    # The environment of the "image": this machine's venv first on PATH, plus extras.
    base_env: Mapping[str, str]
    mountpoints: MountPoints


@dataclass(frozen=True)
class Process:
    pid: int
    argv: tuple[str, ...]
    environ: dict[str, str]


class PodRun:
    def __init__(self, host: Host, pod: dict[str, Any], ip: str) -> None:
        meta = pod["metadata"]
        self.host = host
        self.pod = pod
        self.ip = ip
        self.name, self.namespace, self.uid = meta["name"], meta["namespace"], meta["uid"]
        self.dir = host.workdir / f"{self.namespace}_{self.name}_{self.uid[:8]}"
        for sub in ("logs", "volumes", "tmp"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        self.hosts_path = self.dir / "hosts"
        self.hosts_path.touch()
        self.state = PodState.of(pod, ip, NODE_IP, now_rfc3339())
        self.finished = threading.Event()
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._terminating = False
        self._killer: threading.Timer | None = None
        self.volumes = PodVolumes(host.core, self.dir / "volumes")
        self._hosts = ""
        # Monotonic times: the pod's start, and the first hosts file naming a peer (once the
        # job's Service exists): a test can check the gang started before its names resolved.
        self.started_at: float | None = None
        self.peers_named_at: float | None = None
        self._thread = threading.Thread(target=self._run, name=f"pod-{self.name}", daemon=True)

    @property
    def address(self) -> PodAddress:
        spec = self.pod.get("spec") or {}
        hostname = spec.get("hostname") or self.name
        return PodAddress(self.ip, hostname, spec.get("subdomain") or "", self.namespace)

    @property
    def context(self) -> PodContext:
        env = {**self.host.base_env, "TMPDIR": str(self.dir / "tmp")}
        return PodContext(ip=self.ip, host_ip=NODE_IP, base_env=env)

    def start(self) -> None:
        self.started_at = time.monotonic()
        self._thread.start()

    def log_path(self, container: str) -> Path:
        return self.dir / "logs" / f"{container}.log"

    @property
    def live(self) -> bool:
        """Running or about to: what a Service's endpoints would still list."""
        return not (self.finished.is_set() or self._terminating)

    def write_hosts(self, content: str, *, names_peers: bool = False) -> None:
        if names_peers and self.peers_named_at is None:
            self.peers_named_at = time.monotonic()
        if content == self._hosts:
            return
        # In place: the file is bind-mounted, and a rename would leave the pod the old inode.
        with self.hosts_path.open("r+") as stream:
            stream.truncate(0)
            stream.write(content)
        self._hosts = content

    def update(self, pod: dict[str, Any]) -> None:
        """A newer version of the pod: refresh its downward API files if metadata changed."""
        before, self.pod = self.pod["metadata"], pod
        after = pod["metadata"]
        if all(before.get(k) == after.get(k) for k in ("labels", "annotations")):
            return
        self.volumes.refresh(pod, self.context)

    def terminate(self, grace: int) -> None:
        """SIGTERM to the pod's processes, SIGKILL `grace` seconds later; then delete it."""
        with self._lock:
            if self._terminating:
                return
            self._terminating = True
            process = self._process
            if process is not None and process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
                self._killer = threading.Timer(max(grace, 0), self.kill)
                self._killer.daemon = True
                self._killer.start()
        if self.finished.is_set():
            self._delete()

    def kill(self) -> None:
        with self._lock:
            process = self._process
            if process is not None and process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)

    def processes(self) -> list[Process]:
        """Every process of the pod, from this machine's /proc (host PIDs)."""
        process = self._process
        if process is None or process.poll() is not None:
            return []
        return [p for p in (_process(pid) for pid in _descendants(process.pid)) if p]

    def _run(self) -> None:
        try:
            self._run_pod()
        except Exception:  # a kubelet bug must not leave stop() waiting for this pod
            logger.exception("pod %s/%s: the test kubelet failed", self.namespace, self.name)
            self.kill()
            self._finish()

    def _run_pod(self) -> None:
        try:
            plan = self._prepare()
        except (Unsupported, OSError, ApiException) as error:
            for container in self.state.main:
                container.exit(START_ERROR_EXIT_CODE, now_rfc3339(), "StartError", str(error))
            self._report()
            self._finish()
            return
        self._report()
        with self._lock, (self.dir / "sandbox.log").open("ab") as errors:
            if not self._terminating:
                self._process = subprocess.Popen(
                    [*ORPHAN_GUARD, *NAMESPACES, "--", sys.executable, str(SANDBOX), str(plan)],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=errors,
                    start_new_session=True,
                )
        if self._process is not None:
            assert self._process.stdout is not None
            for line in self._process.stdout:
                self._on_event(json.loads(line))
            self._process.wait()
        self.state.end_all(KILLED_EXIT_CODE, now_rfc3339(), "killed with the pod's sandbox")
        self._report()
        self._finish()

    def _on_event(self, event: dict[str, Any]) -> None:
        container, now = self.state.container(event["container"]), now_rfc3339()
        if event["event"] == "started":
            container.start(now)
        elif event["event"] == "exited":
            container.exit(int(event["code"]), now)
        else:
            container.exit(START_ERROR_EXIT_CODE, now, "StartError", event.get("message", ""))
        self._report()

    def _finish(self) -> None:
        if self._killer is not None:
            self._killer.cancel()
        self.finished.set()
        if self._terminating:
            self._delete()

    def _report(self) -> None:
        current = (self.pod.get("status") or {}).get("conditions") or []
        body = {"status": self.state.status(now_rfc3339(), current)}
        try:
            self.host.core.patch_namespaced_pod_status(
                self.name, self.namespace, body,
                _content_type="application/merge-patch+json", _preload_content=False,
            )  # fmt: skip
        except ApiException as error:
            if error.status != 404:
                raise

    def _delete(self) -> None:
        force_delete(self.host.core, self.namespace, self.name, self.uid)

    def _prepare(self) -> Path:
        """Volumes, mount points and the sandbox's plan file; returns the plan's path."""
        context = self.context
        init, main = plan_containers(self.pod, context)
        sources = self.volumes.prepare(self.pod, context)
        plan = {
            "hostname": self.address.hostname,
            "hostsFile": str(self.hosts_path),
            "initContainers": [self._container(c, sources) for c in init],
            "containers": [self._container(c, sources) for c in main],
        }
        path = self.dir / "plan.json"
        path.write_text(json.dumps(plan, indent=1))
        return path

    def _container(self, plan: ContainerPlan, sources: Mapping[str, Path]) -> dict[str, Any]:
        mounts = []
        for mount in plan.mounts:
            if mount.volume not in sources:
                raise Unsupported(f"volumeMounts[{mount.volume}]: no volume of that name")
            source = sources[mount.volume]
            self.host.mountpoints.ensure(Path(mount.path), file=source.is_file())
            mounts.append(
                {"source": str(source), "target": mount.path, "readOnly": mount.read_only}
            )
        return {
            "name": plan.name,
            "argv": list(plan.argv),
            "env": plan.env,
            "cwd": plan.cwd,
            "log": str(self.log_path(plan.name)),
            "mounts": mounts,
        }


def force_delete(core: client.CoreV1Api, namespace: str, name: str, uid: str) -> None:
    """Delete with grace period 0: the kubelet's confirmation that nothing of the pod runs."""
    options = {"gracePeriodSeconds": 0, "preconditions": {"uid": uid}}
    try:
        core.delete_namespaced_pod(name, namespace, body=options, _preload_content=False)
    except ApiException as error:
        if error.status not in (404, 409):  # gone, or a new pod under the same name
            raise


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parent = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(parent, []).append(int(entry.name))
    found, pending = [], [root]
    while pending:
        pid = pending.pop()
        found.append(pid)
        pending.extend(children.get(pid, []))
    return found


def _process(pid: int) -> Process | None:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    environ = dict(item.decode(errors="replace").partition("=")[::2] for item in raw if item)
    return Process(pid, tuple(a.decode(errors="replace") for a in argv if a), environ)
