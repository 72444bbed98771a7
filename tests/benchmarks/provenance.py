"""What every benchmark result records about where it came from."""

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def git_commit() -> str:
    """The short commit the numbers were measured on, or "unknown" outside a checkout."""
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO, capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
