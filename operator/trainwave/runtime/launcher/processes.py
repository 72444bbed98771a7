"""The training processes of this pod, as /proc shows them to the launcher.

The launcher's child is torch's elastic agent (torch.distributed.run); the agent's
children are the training processes, one per local rank, each started with
RANK and TORCHELASTIC_RESTART_COUNT in its environment
(torch/distributed/elastic/agent/server/local_elastic_agent.py, _start_workers).
Warm-started (warm.py), they are the children of the agent's forkserver instead and
write both to a file, since a forked process's /proc environ is its server's.
A container shares one pid namespace, and the launcher runs as the same user
as its grandchildren, so their /proc/<pid>/stat and environ are readable.
Parsing is pure; reading takes the /proc root so tests use a directory.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
RESTART_COUNT_ENV = "TORCHELASTIC_RESTART_COUNT"  # torch's generation counter
RUNNING, STOPPED, EXITED, UNKNOWN = "running", "stopped", "exited", "unknown"
# proc(5) state letters: a sleeping process waits for I/O or a collective, it still runs.
_STATES = {
    "R": RUNNING,
    "S": RUNNING,
    "D": RUNNING,
    "I": RUNNING,
    "W": RUNNING,
    "P": RUNNING,
    "T": STOPPED,  # SIGSTOP, SIGTSTP
    "t": STOPPED,  # stopped by a tracer
    "Z": EXITED,  # a zombie: exited, not reaped yet
    "X": EXITED,
    "x": EXITED,
}


@dataclass(frozen=True)
class Stat:
    pid: int
    comm: str
    state: str  # running | stopped | exited | unknown
    ppid: int


@dataclass(frozen=True)
class Worker:
    """One training process of the current generation."""

    pid: int
    rank: int | None  # global RANK from its environment
    generation: int  # TORCHELASTIC_RESTART_COUNT
    state: str


def parse_stat(text: str) -> Stat:
    """/proc/<pid>/stat: `pid (comm) S ppid ...`; comm may hold spaces and parentheses."""
    head, close, tail = text.rpartition(")")
    pid_text, open_paren, comm = head.partition(" (")
    fields = tail.split()
    if not close or not open_paren or len(fields) < 2 or not pid_text.strip().isdigit():
        raise ValueError(f"not a /proc/<pid>/stat line: {text[:120]!r}")
    return Stat(
        pid=int(pid_text),
        comm=comm,
        state=_STATES.get(fields[0], UNKNOWN),
        ppid=int(fields[1]),
    )


def parse_environ(data: bytes) -> dict[str, str]:
    """/proc/<pid>/environ: NUL-separated NAME=value pairs, as the process was started."""
    env = {}
    for item in data.split(b"\0"):
        name, sep, value = item.partition(b"=")
        if sep and name:
            env[name.decode(errors="replace")] = value.decode(errors="replace")
    return env


def read_stat(pid: int, proc: Path = PROC) -> Stat | None:
    """None when the process is gone (or its stat is unreadable)."""
    try:
        return parse_stat((proc / str(pid) / "stat").read_text())
    except (OSError, ValueError):
        return None


def state_of(pid: int, proc: Path = PROC) -> str:
    stat = read_stat(pid, proc)
    return EXITED if stat is None else stat.state


def workers_of(agent_pid: int, proc: Path = PROC, identities: Path | None = None) -> list[Worker]:
    """The training processes torch's agent started, by pid: its children, started with
    RANK and TORCHELASTIC_RESTART_COUNT in their environment, or, warm-started, the
    children of its forkserver, which left both in `identities/<pid>.json` (warm_child.py)."""
    stats = [stat for entry in _pids(proc) if (stat := read_stat(entry, proc)) is not None]
    children = {stat.pid for stat in stats if stat.ppid == agent_pid}
    found = []
    for stat in stats:
        if stat.ppid == agent_pid:
            env = _environ(stat.pid, proc)
        elif identities is not None and stat.ppid in children:
            env = _identity(identities / f"{stat.pid}.json")
        else:
            continue
        if env is None or RESTART_COUNT_ENV not in env:
            continue  # not a training process (the forkserver, torch's resource tracker)
        found.append(
            Worker(
                pid=stat.pid,
                rank=_integer(env.get("RANK")),
                generation=_integer(env[RESTART_COUNT_ENV]) or 0,
                state=stat.state,
            )
        )
    return sorted(found, key=lambda w: w.pid)


def _environ(pid: int, proc: Path) -> dict[str, str] | None:
    try:
        return parse_environ((proc / str(pid) / "environ").read_bytes())
    except OSError:
        return None


def _identity(path: Path) -> dict[str, str] | None:
    """{"rank": .., "generation": ..} as the environment's names; None until it is written."""
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(found, dict) or found.get("generation") is None:
        return None
    return {"RANK": str(found.get("rank")), RESTART_COUNT_ENV: str(found["generation"])}


def _pids(proc: Path) -> list[int]:
    try:
        return [int(name) for name in os.listdir(proc) if name.isdigit()]
    except OSError:
        return []


def _integer(text: str | None) -> int | None:
    try:
        return None if text is None else int(text)
    except ValueError:
        return None
