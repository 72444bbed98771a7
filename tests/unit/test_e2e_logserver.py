"""The test kubelet's log endpoint, spoken to directly the way the API server does."""

from __future__ import annotations

import http.client
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.logserver import LogServer

pytestmark = pytest.mark.timeout(20)


class FakeRun:
    """What the log server needs of a PodRun: where a container's log is, and whether it ended."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.finished = threading.Event()

    def log_path(self, container: str) -> Path:
        return self.directory / f"{container}.log"


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[LogServer, FakeRun]]:
    run = FakeRun(tmp_path)
    server = LogServer("127.0.0.1", tmp_path, lambda ns, pod: run if pod == "p" else None)  # type: ignore[arg-type, return-value]
    server.start()
    yield server, run
    run.finished.set()
    server.stop()


def get(server: LogServer, path: str) -> tuple[int, bytes]:
    # Unverified, as the local API server calls kubelets (no --kubelet-certificate-authority).
    context = ssl._create_unverified_context()
    connection = http.client.HTTPSConnection("127.0.0.1", server.port, context=context, timeout=10)
    connection.request("GET", path)
    response = connection.getresponse()
    return response.status, response.read()


@pytest.mark.parametrize(
    ("query", "body"),
    [
        pytest.param("", b"one\ntwo\nthree\n", id="whole"),
        pytest.param("?tailLines=2", b"two\nthree\n", id="tail"),
        pytest.param("?tailLines=0", b"", id="tail-zero"),
        pytest.param("?limitBytes=5", b"one\nt", id="limit"),
    ],
)
def test_a_finished_log(served: tuple[LogServer, FakeRun], query: str, body: bytes) -> None:
    server, run = served
    run.log_path("worker").write_bytes(b"one\ntwo\nthree\n")
    run.finished.set()
    assert get(server, f"/containerLogs/ns/p/worker{query}") == (200, body)


def test_follow_sends_what_is_appended_until_the_pod_ends(
    served: tuple[LogServer, FakeRun],
) -> None:
    server, run = served
    log = run.log_path("worker")
    log.write_bytes(b"first\n")

    def write_later() -> None:
        time.sleep(0.3)
        with log.open("ab") as stream:
            stream.write(b"second\n")
        time.sleep(0.3)
        with log.open("ab") as stream:
            stream.write(b"last\n")
        run.finished.set()

    threading.Thread(target=write_later, daemon=True).start()
    began = time.monotonic()
    assert get(server, "/containerLogs/ns/p/worker?follow=true") == (200, b"first\nsecond\nlast\n")
    assert time.monotonic() - began >= 0.5  # it waited for the lines, not only read the file


@pytest.mark.parametrize(
    ("path", "status", "words"),
    [
        pytest.param("/containerLogs/ns/p/worker", 400, b"is waiting to start", id="not-started"),
        pytest.param("/containerLogs/ns/other/worker", 404, b"not on this kubelet", id="no-pod"),
        pytest.param("/containerLogs/ns/p/worker?previous=true", 400, b"previous terminated",
                     id="previous"),
        pytest.param("/stats/summary", 404, b"no such endpoint", id="other-endpoint"),
    ],
)  # fmt: skip
def test_refusals(served: tuple[LogServer, FakeRun], path: str, status: int, words: bytes) -> None:
    server, _ = served
    got_status, body = get(server, path)
    assert got_status == status
    assert words in body
