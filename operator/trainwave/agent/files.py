"""Files the agent hands to other processes on the node (the arbiter, the container runtime)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def replace_if_changed(path: Path, text: str) -> bool:
    """Write `text` to `path` only when it differs, and atomically (a staged file renamed
    into place), so a reader never sees half a file. True when written."""
    try:
        if path.read_text() == text:
            return False
    except OSError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, staged = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(handle, "w") as out:
        out.write(text)
    os.chmod(staged, 0o644)  # other users' processes read it (arbiter, container runtime)
    os.replace(staged, path)
    return True
