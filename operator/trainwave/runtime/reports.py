"""The report directory: JSON files the training process writes and the launcher serves.

The launcher and the training processes are separate processes that share
only this directory, so every write is atomic (temp file, then rename): a
reader sees the previous report or the next one, never half of one.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

DOCTOR_FILE = "doctor.json"
PROGRESS_PREFIX = "progress-rank"
# A new process's first report moves its rank's last one here, so the launcher still finds
# the old generation's last step even when it polled between that step and the restart.
PREVIOUS_PREFIX = "previous-rank"
# NCCL expands %h (host) and %p (pid) itself; the doctor reads these files.
NCCL_LOG_PATTERN = "nccl.%h.%p.log"
NCCL_LOG_GLOB = "nccl.*.log"
# Warm-started training processes write their rank and generation here, one file per pid
# (launcher/warm_child.py), since their /proc environ is the forkserver's.
IDENTITY_DIR = "processes"


def write_json_atomic(path: Path, document: Any) -> None:
    """Write `document` as JSON to `path` so readers never see a partial file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(handle, "w") as stream:
            json.dump(document, stream, indent=1, sort_keys=True)
            stream.write("\n")
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def progress_path(report_dir: Path, rank: int) -> Path:
    return report_dir / f"{PROGRESS_PREFIX}{rank}.json"


def keep_previous(report_dir: Path, rank: int) -> None:
    """Move `rank`'s progress report aside before a new process writes its first one."""
    with contextlib.suppress(FileNotFoundError):  # the first generation: nothing to keep
        os.replace(progress_path(report_dir, rank), report_dir / f"{PREVIOUS_PREFIX}{rank}.json")


def read_json(path: Path) -> Any | None:
    """A report, or None when it does not exist (yet) or cannot be parsed."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def latest_progress(report_dir: Path) -> dict[str, Any] | None:
    """The progress report of the lowest rank on this node that wrote one."""
    if not report_dir.is_dir():
        return None
    reports = sorted(
        report_dir.glob(f"{PROGRESS_PREFIX}*.json"),
        key=lambda path: _rank_of(path.stem),
    )
    for path in reports:
        document = read_json(path)
        if isinstance(document, dict):
            return document
    return None


def all_progress(report_dir: Path, prefix: str = PROGRESS_PREFIX) -> dict[int, dict[str, Any]]:
    """Every rank's progress report in the directory, by rank; unreadable ones left out.
    With PREVIOUS_PREFIX: the reports the ranks' previous processes wrote last."""
    found: dict[int, dict[str, Any]] = {}
    if not report_dir.is_dir():
        return found
    for path in report_dir.glob(f"{prefix}*.json"):
        rank = _rank_of(path.stem, prefix)
        document = read_json(path)
        if rank != 1 << 30 and isinstance(document, dict):
            found[rank] = document
    return found


def _rank_of(stem: str, prefix: str = PROGRESS_PREFIX) -> int:
    digits = stem.removeprefix(prefix)
    return int(digits) if digits.isdigit() else 1 << 30
