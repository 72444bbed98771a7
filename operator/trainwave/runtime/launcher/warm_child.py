"""The entry point of a warm-started training process (launcher/warm.py).

The process was forked from torch's forkserver, so two things a fresh `python
train.py` would have differ, and are put right here before the script runs:
- /proc/<pid>/environ shows the server's environment, not the RANK and
  TORCHELASTIC_RESTART_COUNT torch's agent set for this process (it sets them in
  os.environ after the fork). The launcher's monitor finds its training processes by
  those, so the process writes them to `<report dir>/processes/<pid>.json`
  (processes.py reads it).
- numpy's global generator was seeded once, in the server, and every forked process
  would draw the same numbers; it is reseeded from the OS as a fresh import would be.
  Python's `random` reseeds itself after a fork; torch's default generator starts from
  the same fixed seed in any new process.
Then the script runs as `python script.py` would run it: `__main__`, its directory
first on sys.path, sys.argv as given (torchrun's run_script_path does the same runpy call).
"""

from __future__ import annotations

import os
import runpy
import sys
from collections.abc import Mapping
from pathlib import Path

from trainwave import contract
from trainwave.runtime import reports

RANK_ENV, GENERATION_ENV = "RANK", "TORCHELASTIC_RESTART_COUNT"


def identity_path(report_dir: Path, pid: int) -> Path:
    return report_dir / reports.IDENTITY_DIR / f"{pid}.json"


def record_identity(environ: Mapping[str, str], pid: int) -> None:
    report_dir = environ.get(contract.ENV_REPORT_DIR)
    if not report_dir:
        return  # not under the launcher: nobody reads it
    reports.write_json_atomic(
        identity_path(Path(report_dir), pid),
        {"rank": environ.get(RANK_ENV), "generation": environ.get(GENERATION_ENV)},
    )


def reseed_numpy() -> None:
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()


def run(script: str, *args: str) -> None:
    record_identity(os.environ, os.getpid())
    reseed_numpy()
    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(script))
    runpy.run_path(script, run_name="__main__")
