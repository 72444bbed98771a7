"""The runtime's log lines: one JSON object per stderr line, each written in one call.

print(line, file=sys.stderr) writes the line and its newline in two calls, and stderr passes
each straight to the pipe: the launcher, its forkserver and the training processes share
that pipe, so another process's line could land between them and join two records on one
line (seen in CI: a warm start's `preload-failed` followed by the launcher's `exited`).
One write of a line up to PIPE_BUF (4 KiB) bytes is never split by another writer.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping
from typing import Any


def emit(logger: str, event: str, **fields: Any) -> None:
    write_line({"ts": round(time.time(), 3), "logger": logger, "event": event, **fields})


def write_line(record: Mapping[str, Any]) -> None:
    sys.stderr.write(json.dumps(record, default=str) + "\n")
    sys.stderr.flush()
