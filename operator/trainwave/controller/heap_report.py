"""Where the operator's memory goes: tracemalloc on request, a report on SIGUSR2 and at exit.

Off unless TRAINWAVE_TRACEMALLOC is set, and then nothing is traced or imported:
tracing every allocation costs CPU and roughly doubles the memory it measures, so
a run that reports RSS must not have it on. With TRAINWAVE_TRACEMALLOC=N (frames
kept per allocation; 1 is enough for "which line"; 8 names the call that decoded
what json.loads built: an informer's watch, or a client call such as a status patch.
tracemalloc knows where an object was made, never who holds it: every informer decodes
on the same line, so which cache keeps its share is for the code to say),
`kill -USR2 <pid>` appends a report to TRAINWAVE_TRACEMALLOC_OUT (default:
stderr, i.e. the operator's log), and one more is written when the process exits.
Tracing starts after the operator's imports (traced, with 6 frames, they take half
a minute of CPU): the report gives the RSS at that moment as the imports' share.

A report lists the live Python allocations by source line, by file and by the
package that owns the file (kopf, kubernetes, trainwave, json...), with the
process's RSS beside them: what tracemalloc does not see (the interpreter's
arenas' free space, C libraries, thread stacks) is the difference.
"""

from __future__ import annotations

import atexit
import linecache
import os
import signal
import sys
import time
import tracemalloc
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from types import FrameType

ENV_FRAMES = "TRAINWAVE_TRACEMALLOC"
ENV_OUT = "TRAINWAVE_TRACEMALLOC_OUT"
TOP = 40
MIB = 1024 * 1024
_AT_START = {"rss": "unknown"}  # before tracing: the interpreter and the modules imported


def install_from_env(environ: Mapping[str, str] = os.environ) -> bool:
    """Start tracing and hook SIGUSR2 and exit when ENV_FRAMES asks; whether it did.
    Call from the main thread (signal handlers can only be set there)."""
    value = environ.get(ENV_FRAMES, "").strip()
    if not value or value == "0":
        return False
    try:
        frames = int(value)
    except ValueError:
        frames = 1
    if frames < 1:
        raise ValueError(f"{ENV_FRAMES}={value!r}: expected a number of frames >= 1 (or 0: off)")
    out = environ.get(ENV_OUT, "")
    _AT_START["rss"] = _status("VmRSS")
    tracemalloc.start(frames)

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        write_report(out, "SIGUSR2")

    signal.signal(signal.SIGUSR2, on_signal)
    atexit.register(write_report, out, "exit")
    return True


def write_report(out: str, reason: str) -> None:
    text = report(tracemalloc.take_snapshot(), reason)
    if out:
        with Path(out).open("a") as handle:
            handle.write(text)
    else:
        sys.stderr.write(text)
        sys.stderr.flush()


def report(snapshot: tracemalloc.Snapshot, reason: str, top: int = TOP) -> str:
    """The snapshot as text: totals, then the largest holders by line, file and package."""
    snapshot = snapshot.filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
    by_line = snapshot.statistics("lineno")
    traced = sum(s.size for s in by_line)
    _, peak = tracemalloc.get_traced_memory()
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    lines = [
        f"# heap report ({reason}) pid {os.getpid()} at {when}",
        f"traced now {traced / MIB:.1f} MiB (peak {peak / MIB:.1f}); "
        f"process {_status('VmRSS')}, peak {_status('VmHWM')} (RSS counts tracemalloc's own "
        f"bookkeeping: {tracemalloc.get_tracemalloc_memory() / MIB:.1f} MiB)",
        f"not traced: what was allocated before tracing started (the interpreter and the "
        f"modules imported by then), RSS {_AT_START['rss']} at the start",
    ]
    # json.loads allocates every dict of a watch event inside json/decoder.py: what says
    # who keeps it is the innermost frame outside the standard library (the "owner"),
    # found only when more than one frame is kept.
    packages: Counter[str] = Counter()
    owners: Counter[str] = Counter()
    for stat in snapshot.statistics("traceback"):
        frame = _owner(stat.traceback)
        packages[_package(frame.filename)] += stat.size
        owners[f"{_short(frame.filename)}:{frame.lineno}"] += stat.size
    lines += ["", f"## by package (frames kept: {tracemalloc.get_traceback_limit()})"]
    lines += [f"{size / MIB:8.2f} MiB  {name}" for name, size in packages.most_common(top)]
    lines += ["", "## by owner: innermost line outside the standard library"]
    for where, size in owners.most_common(top):
        filename, _, number = where.rpartition(":")
        code = _code(filename, int(number))
        lines.append(f"{size / MIB:8.2f} MiB  {where}  {code}")
    lines += ["", "## by line (innermost frame)"]
    for stat in by_line[:top]:
        frame = stat.traceback[0]
        where = f"{_short(frame.filename)}:{frame.lineno}"
        lines.append(f"{stat.size / MIB:8.2f} MiB {stat.count:9d}  {where}")
    if tracemalloc.get_traceback_limit() > 1:
        lines += ["", "## by traceback (largest, innermost frame last)"]
        for stat in snapshot.statistics("traceback")[: top // 4]:
            lines.append(f"{stat.size / MIB:8.2f} MiB {stat.count:9d}")
            lines += [f"      {_short(f.filename)}:{f.lineno}" for f in stat.traceback]
    return "\n".join(lines) + "\n\n"


_STDLIB = os.path.dirname(os.__file__)
_FULL_PATHS: dict[str, str] = {}


def _owner(traceback: tracemalloc.Traceback) -> tracemalloc.Frame:
    """The innermost frame outside the standard library (else the innermost one)."""
    frames = list(traceback)  # oldest first
    for frame in reversed(frames):
        name = frame.filename
        outside = not name.startswith("<") and (not name.startswith(_STDLIB) or "-packages" in name)
        if outside:
            _FULL_PATHS[_short(name)] = name
            return frame
    return frames[-1]


def _code(short: str, number: int) -> str:
    return linecache.getline(_FULL_PATHS.get(short, short), number).strip()[:70]


def _package(filename: str) -> str:
    """The top-level package a file belongs to: kopf, kubernetes, trainwave, json, ..."""
    path = Path(filename)
    parts = path.parts
    for anchor in ("site-packages", "dist-packages"):
        if anchor in parts:
            rest = parts[parts.index(anchor) + 1 :]
            return rest[0].removesuffix(".py") if rest else filename
    if "trainwave" in parts:
        index = len(parts) - 1 - parts[::-1].index("trainwave")
        return "/".join(parts[index : index + 2])  # trainwave/controller, trainwave/api...
    if filename.startswith("<"):
        return filename  # <frozen importlib._bootstrap>: code objects of imported modules
    return f"stdlib:{path.stem}"


def _short(filename: str) -> str:
    for anchor in ("site-packages/", "/operator/", "/lib/python3"):
        index = filename.find(anchor)
        if index >= 0:
            return filename[index + len(anchor) :]
    return filename


def _status(field: str) -> str:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                kib = int(line.split()[1])
                return f"{kib / 1024:.1f} MiB"
    except OSError:
        pass
    return "unknown"
