"""What every benchmark result records about where it came from."""

import json
import subprocess
from pathlib import Path
from typing import Any

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


def write_results(stem: Path, result: dict[str, Any], markdown: str) -> None:
    """`stem`.json (the numbers) and `stem`.md (the report people read), side by side."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    stem.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    stem.with_suffix(".md").write_text(markdown)
