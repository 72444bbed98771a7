"""Start, watch and stop the control plane's processes.

Each component runs in its own session, so it leads its own process group and
a stop reaches any children it forked; its pid is the group id we record.
Nothing here knows which component is which: that lives in components.py.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

# Popen objects of the components this Python process started, so that a
# stopped child is reaped (no zombie left under pytest) and Python does not
# warn about a child "still running" when the object is collected.
_children: dict[int, subprocess.Popen[bytes]] = {}


@dataclass(frozen=True)
class ProcessRecord:
    name: str
    pid: int
    log: str

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "pid": self.pid, "log": self.log}

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> ProcessRecord:
        return cls(name=str(data["name"]), pid=int(str(data["pid"])), log=str(data["log"]))


def spawn(
    name: str, argv: list[str], log: Path, cwd: Path, env: Mapping[str, str] | None = None
) -> ProcessRecord:
    """Start `argv` detached from our terminal, stdout and stderr appended to `log`."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as output:
        process = subprocess.Popen(
            argv,
            cwd=cwd,
            env=dict(env) if env is not None else None,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    _children[process.pid] = process
    return ProcessRecord(name=name, pid=process.pid, log=str(log))


def is_alive(pid: int) -> bool:
    """True while the process exists and is not a zombie waiting to be reaped."""
    _reap(pid)
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            # The state follows the parenthesised command name, which may hold spaces.
            state = stat.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")


def exit_code(pid: int) -> int | None:
    """The exit status of a child this process started, once it ended."""
    process = _children.get(pid)
    return None if process is None else process.poll()


def command_line(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return cmdline.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def stop_groups(pids: Iterable[int], grace: float) -> None:
    """SIGTERM every group, wait up to `grace` seconds for all, then SIGKILL the rest."""
    pids = [pid for pid in pids if is_alive(pid)]
    for pid in pids:
        _signal_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(is_alive(pid) for pid in pids):
        time.sleep(0.05)
    for pid in pids:
        if is_alive(pid):
            _signal_group(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(is_alive(pid) for pid in pids):
        time.sleep(0.02)
    for pid in pids:
        _reap(pid)
        _children.pop(pid, None)


def processes_referencing(text: str) -> list[int]:
    """Pids whose command line mentions `text` (the state dir): strays of a lost record."""
    ours = {os.getpid(), *_ancestors()}
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in ours:
            continue
        if text in command_line(int(entry.name)) and is_alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def _signal_group(pid: int, signum: signal.Signals) -> None:
    try:
        os.killpg(pid, signum)
    except ProcessLookupError:
        return
    except PermissionError:
        # Not a group leader we own (a stray started some other way): the process alone.
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            return


def _reap(pid: int) -> None:
    process = _children.get(pid)
    if process is not None:
        process.poll()
        return
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def _ancestors() -> list[int]:
    pids = []
    pid = os.getppid()
    while pid > 1:
        pids.append(pid)
        try:
            with open(f"/proc/{pid}/stat", "rb") as stat:
                pid = int(stat.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            break
    return pids
