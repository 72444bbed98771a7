"""warm.py starts torch's forkserver before the agent imports torch, so that the two imports
run side by side; a command it must run cold (here `--no-python`) stops that server again,
before the command runs. Real torch, real processes, loopback only."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)
REPO = Path(__file__).resolve().parents[4]

# The worker is the agent's child: it lists the agent's other children (the forkserver
# would be one, running `from multiprocessing.forkserver import main`).
PROBE = """
ppid=$(cut -d' ' -f4 /proc/$$/stat)
for task in /proc/$ppid/task/*; do
  for child in $(cat "$task/children"); do
    [ "$child" = "$$" ] && continue
    tr '\\0' ' ' < /proc/$child/cmdline; echo
  done
done > "$1"
"""


def test_a_command_run_cold_finds_no_forkserver_beside_it(tmp_path: Path) -> None:
    found, probe = tmp_path / "siblings", tmp_path / "probe.sh"
    probe.write_text(PROBE)
    env = {**os.environ, "PYTHONPATH": str(REPO / "operator")}
    done = subprocess.run(
        [sys.executable, "-m", "trainwave.runtime.launcher.warm", "--standalone",
         "--nproc-per-node", "1", "--no-python", "/bin/sh", str(probe), str(found)],
        env=env, capture_output=True, text=True, timeout=100, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert '"cold-start"' in done.stderr
    assert "--no-python" in done.stderr
    siblings = found.read_text()
    assert "forkserver" not in siblings, siblings
