"""Faults for bench_faults.py, injected from the host, and a watch on the job's status.

The real node's containers run in this machine's pid namespace, so a training process
is found through /proc like any other: its command line runs fault_worker.py (and is
neither the elastic agent, `torch.distributed.run`, nor trainwave's launcher) and its
environment names the job and the global rank torchrun gave it.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

from kubernetes import client, config

from trainwave import contract

SCRIPT = "fault_worker.py"
NOT_TRAINING = ("torch.distributed.run", "trainwave.runtime.launch")


def training_processes(
    namespace: str, job: str, rank: int, proc: Path = Path("/proc")
) -> list[int]:
    """Pids of the live training processes of `job` with global rank `rank`."""
    wanted = {
        f"{contract.ENV_JOB_NAMESPACE}={namespace}",
        f"{contract.ENV_JOB_NAME}={job}",
        f"RANK={rank}",
    }
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            command = b" ".join(argv).decode(errors="replace")
            if SCRIPT not in command or any(marker in command for marker in NOT_TRAINING):
                continue
            environment = set((entry / "environ").read_bytes().decode(errors="replace").split("\0"))
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:  # gone while we looked
            continue
        if wanted <= environment and state not in ("Z", "X"):
            found.append(int(entry.name))
    return found


def inject(kind: str, pid: int, done: threading.Event, slow_seconds: float) -> threading.Thread:
    """Start fault `kind` on `pid`; the thread ends when `done` is set (or the slow ends)."""
    actions = {"kill": _kill, "stop": _stop, "slow": _slow}
    if kind not in actions:
        raise ValueError(f"fault kind {kind!r}: expected one of {sorted(actions)}")
    thread = threading.Thread(
        target=actions[kind], args=(pid, done, slow_seconds), name=f"fault-{kind}", daemon=True
    )
    thread.start()
    return thread


def _signal(pid: int, signum: int) -> bool:
    try:
        os.kill(pid, signum)
        return True
    except ProcessLookupError:
        return False


def _kill(pid: int, done: threading.Event, _: float) -> None:
    _signal(pid, signal.SIGKILL)


def _stop(pid: int, done: threading.Event, _: float) -> None:
    _signal(pid, signal.SIGSTOP)
    done.wait()
    _signal(pid, signal.SIGCONT)  # if nobody killed it, it must not stay stopped after the run


def _slow(pid: int, done: threading.Event, seconds: float) -> None:
    """Stopped for half of every 100 ms: the process gets half its CPU time."""
    ends = time.monotonic() + seconds
    try:
        while not done.is_set() and time.monotonic() < ends:
            if not _signal(pid, signal.SIGSTOP):
                return
            time.sleep(0.05)
            _signal(pid, signal.SIGCONT)
            time.sleep(0.05)
    finally:
        _signal(pid, signal.SIGCONT)


class StatusWatch:
    """Polls one TrainingJob twice a second and keeps each change of what matters here."""

    def __init__(self, kubeconfig: Path, namespace: str, name: str, every: float = 0.5) -> None:
        api_client = config.new_client_from_config(config_file=str(kubeconfig))
        self._api = client.CustomObjectsApi(api_client)
        self._where = (namespace, name)
        self._every = every
        self._changes: list[tuple[float, dict[str, Any]]] = []
        self._status: dict[str, Any] = {}
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="status-watch", daemon=True)

    def start(self) -> StatusWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        namespace, name = self._where
        while not self._stopped.is_set():
            try:
                found = self._api.get_namespaced_custom_object(
                    "trainwave.io", "v1alpha1", namespace, "trainingjobs", name
                )
            except client.ApiException:
                found = {}
            status = found.get("status") or {}
            self._status = status
            view = _view(status)
            if not self._changes or self._changes[-1][1] != view:
                self._changes.append((time.time(), view))
            self._stopped.wait(self._every)

    def last(self) -> dict[str, Any]:
        return dict(self._status)

    def phase(self) -> str | None:
        return self._status.get("phase")

    def changes(self) -> list[dict[str, Any]]:
        return [{"t": round(t, 2), **view} for t, view in self._changes]

    def first_change_after(self, since: float) -> float | None:
        """When the status first showed a repair or a hang after `since`."""
        return first_change_after(self._changes, since)

    def wait_condition(self, kind: str, text: str, since: float, timeout: float) -> float | None:
        """When condition `kind` first showed True with `text` in its message after `since`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for t, view in self._changes:
                status, message = view["conditions"].get(kind, ("", ""))
                if t > since and status == "True" and text in message:
                    return t
            time.sleep(0.25)
        return None


def _view(status: dict[str, Any]) -> dict[str, Any]:
    goodput = status.get("goodput") or {}
    return {
        "phase": status.get("phase"),
        "attempt": status.get("attempt"),
        "restarts": status.get("restarts"),
        "in_place": goodput.get("inPlaceRestarts"),
        "conditions": {
            c.get("type"): (c.get("status"), c.get("message", ""))
            for c in status.get("conditions") or []
            if c.get("type") in ("Hung", "Straggler", "Running")
        },
    }


def first_change_after(changes: list[tuple[float, dict[str, Any]]], since: float) -> float | None:
    """The first time after `since` a count of repairs went up (attempt, restarts, in-place
    restarts) or the Hung condition turned True. Counts that first appear (None -> 0) are
    not news."""
    before = next((v for t, v in reversed(changes) if t <= since), None)
    if before is None:
        return None
    for t, view in changes:
        if t <= since:
            continue
        if any((view[k] or 0) > (before[k] or 0) for k in ("attempt", "restarts", "in_place")):
            return t
        if view["conditions"].get("Hung", ("", ""))[0] == "True":
            return t
    return None
