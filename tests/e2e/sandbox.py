"""One pod's "sandbox": runs as PID 1 of the pod's namespaces and starts its containers.

    unshare --uts --mount --propagation private --pid --kill-child -- \
        python sandbox.py PLAN.json

Standard library only, started by the test kubelet (podrun.py), which does
all the resolving and reads this process's stdout: one JSON line per
container event, {"event": "started"|"exited"|"start-failed", "container":
NAME, "code": N, "message": TEXT}. In order:
- the pod's hostname, and its hosts file bind-mounted over /etc/hosts;
- each init container in order, to completion; a failure ends the pod;
- then every container at once, each in a mount namespace of its own with
  its volumes bind-mounted at their mountPaths, output appended to its log.
PID 1 reaps every process of the pod, so an exit status always reaches the
container it belongs to. SIGTERM reaches the containers directly (they share
this process group) and stops further containers from starting. When PID 1
ends, the kernel kills whatever is left in the PID namespace: that is the
kubelet's SIGKILL, and nothing of the pod can outlive it.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

CLONE_NEWNS = 0x00020000
MS_RDONLY = 1
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384

_libc = ctypes.CDLL(None, use_errno=True)
# Set on SIGTERM: no further container starts.
_terminating: list[bool] = []


def _on_sigterm(_signum: int, _frame: object) -> None:
    _terminating.append(True)


def emit(event: str, container: str, code: int | None = None, message: str = "") -> None:
    record: dict[str, Any] = {"event": event, "container": container}
    if code is not None:
        record["code"] = code
    if message:
        record["message"] = message
    print(json.dumps(record), flush=True)


def bind(source: str, target: str, read_only: bool) -> None:
    if _libc.mount(source.encode(), target.encode(), None, MS_BIND | MS_REC, None) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"bind mount {source} -> {target}: {os.strerror(error)}")
    if read_only:
        flags = MS_BIND | MS_REMOUNT | MS_RDONLY
        if _libc.mount(None, target.encode(), None, flags, None) != 0:
            error = ctypes.get_errno()
            raise OSError(error, f"read-only remount of {target}: {os.strerror(error)}")


def _container_setup(container: dict[str, Any]) -> None:
    """In the forked child, before exec: its own mount namespace, its volumes, its cwd."""
    try:
        if _libc.unshare(CLONE_NEWNS) != 0:
            raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS)")
        for mount in container["mounts"]:
            bind(mount["source"], mount["target"], mount["readOnly"])
        os.chdir(container["cwd"])
    except OSError as error:
        # stderr is already the container's log: the reason lands where users look.
        os.write(2, f"test kubelet: cannot set up container: {error}\n".encode())
        raise


def start(container: dict[str, Any]) -> subprocess.Popen[bytes] | None:
    log = open(container["log"], "ab")  # noqa: SIM115 - the child inherits it
    try:
        process = subprocess.Popen(
            container["argv"],
            env=container["env"],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=lambda: _container_setup(container),  # noqa: PLW1509 - single-threaded
        )
    except (OSError, subprocess.SubprocessError) as error:
        emit("start-failed", container["name"], message=f"{type(error).__name__}: {error}")
        return None
    finally:
        log.close()
    emit("started", container["name"])
    return process


def reap(running: dict[int, str]) -> dict[str, int]:
    """Wait until the containers' main processes exit, reaping every other process of
    the pod on the way (orphans are reparented to PID 1); returns their exit codes."""
    codes = {}
    while running:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        name = running.pop(pid, None)
        if name is not None:
            code = os.waitstatus_to_exitcode(status)
            # A container killed by signal N exits 128+N, as container runtimes report.
            codes[name] = 128 - code if code < 0 else code
            emit("exited", name, codes[name])
    return codes


def run(plan: dict[str, Any]) -> None:
    socket.sethostname(plan["hostname"])
    bind(plan["hostsFile"], "/etc/hosts", read_only=False)
    for container in plan["initContainers"]:
        if _terminating:
            return
        process = start(container)
        if process is None:
            return
        if reap({process.pid: container["name"]}).get(container["name"]) != 0:
            return
    if _terminating:
        return
    running = {}
    for container in plan["containers"]:
        process = start(container)
        if process is not None:
            running[process.pid] = container["name"]
    reap(running)


def main() -> int:
    signal.signal(signal.SIGTERM, _on_sigterm)
    plan = json.loads(Path(sys.argv[1]).read_text())
    run(plan)
    return 0


if __name__ == "__main__":
    sys.exit(main())
