"""The runtime's JSON log lines reach stderr whole, in one write each (runtime/jsonlog.py)."""

from __future__ import annotations

import json

import pytest

from trainwave.runtime import jsonlog


class Stderr:
    def __init__(self) -> None:
        self.writes: list[str] = []
        self.flushes = 0

    def write(self, text: str) -> int:
        self.writes.append(text)
        return len(text)

    def flush(self) -> None:
        self.flushes += 1


def test_a_record_and_its_newline_are_one_write_then_a_flush(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stderr = Stderr()
    monkeypatch.setattr("sys.stderr", stderr)
    jsonlog.emit("trainwave.warm", "preload-failed", module="torch._dynamo", error=ValueError("x"))
    jsonlog.write_line({"logger": "trainwave.preflight", "rank": 0})

    assert len(stderr.writes) == 2, "one write per record"
    assert all(w.endswith("\n") and w.count("\n") == 1 for w in stderr.writes)
    assert stderr.flushes == 2
    first = json.loads(stderr.writes[0])
    assert (first["logger"], first["event"], first["error"]) == (
        "trainwave.warm",
        "preload-failed",
        "x",
    )
