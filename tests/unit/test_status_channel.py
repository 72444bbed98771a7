"""The worker status channel as a tenant could abuse it: forged, replayed, redirected, huge, slow.

The servers here are real sockets on loopback: the runtime's own StatusServer
for honest workers, small hand-written ones for the hostile cases.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import pytest

from trainwave import contract, signatures
from trainwave.controller.fetching import FetchError, fetch
from trainwave.controller.reporting import StatusPoller, Targets, parse_networks
from trainwave.runtime.launcher.status import StatusServer

pytestmark = pytest.mark.timeout(30)

MASTER = b"m" * 32
JOB_A = ("team-a", "llm", "uid-aaaa")
JOB_B = ("team-b", "vision", "uid-bbbb")
KEY_A = signatures.job_key(MASTER, *JOB_A)
KEY_B = signatures.job_key(MASTER, *JOB_B)


def identity(job: tuple[str, str, str], attempt: int = 0, rank: int = 0) -> signatures.Identity:
    return signatures.Identity(job[0], job[1], attempt, rank)


def status_document(who: signatures.Identity, step: int = 7) -> dict[str, Any]:
    """What the launcher serves (runtime/launch.py `status`), trimmed to what is read."""
    return {
        "namespace": who.namespace,
        "job": who.job,
        "attempt": who.attempt,
        "node_rank": who.rank,
        "doctor": {
            "verdict": "PASS",
            "checks": [{"name": "nccl_transport", "status": "PASS", "reason": "GDR on IB"}],
        },
        "progress": {"step": step},
    }


@contextmanager
def runtime_server(
    document: dict[str, Any], key: bytes | None, signed_as: signatures.Identity
) -> Iterator[int]:
    """The runtime's StatusServer, signing as `signed_as` with `key` (None: unsigned)."""

    def signer(nonce: str, body: bytes) -> str:
        assert key is not None
        return signatures.sign(key, signed_as, nonce, body)

    server = StatusServer("127.0.0.1", 0, lambda: document, signer if key else None).start()
    try:
        yield server.port
    finally:
        server.stop()


@contextmanager
def raw_server(serve: Callable[[socket.socket], None]) -> Iterator[int]:
    """A listener whose every connection is handed to `serve` in its own thread."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.05)  # how soon the accept loop sees the stop, at teardown
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=_serve_quietly, args=(serve, connection), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join(timeout=2)
        listener.close()


def _serve_quietly(serve: Callable[[socket.socket], None], connection: socket.socket) -> None:
    with connection:
        try:
            connection.settimeout(10)
            connection.recv(4096)  # the request; its content does not matter here
            serve(connection)
        except OSError:
            pass  # the operator hung up on us, as it should


class CountingPoller(StatusPoller):
    """A StatusPoller that counts its finished polls of each job, so a test can wait for
    one whole round of reads rather than for a timer that may be short under load."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.polls: dict[tuple[str, str], int] = {}

    async def _poll(self, pool: ThreadPoolExecutor, key: tuple[str, str], targets: Targets) -> None:
        await super()._poll(pool, key, targets)
        self.polls[key] = self.polls.get(key, 0) + 1


Woken = list[tuple[str, str]]
Until = Callable[[CountingPoller, Woken], bool]


def every_job_polled(targets: dict[tuple[str, str], Targets]) -> Until:
    """Every job's first poll has finished: its reads were all answered or refused, and
    the wake a report brings would have come with them."""
    return lambda poller, _: all(poller.polls.get(key, 0) >= 1 for key in targets)


def poll_once(
    targets: dict[tuple[str, str], Targets],
    *,
    deadline: float = 2.0,
    wait: float = 5.0,
    until: Until | None = None,
) -> tuple[CountingPoller, Woken, float]:
    """Run a poller over `targets` until `until` holds (by default: every job was
    woken), for `wait` seconds at most; returns the jobs woken and the seconds until
    the last of them was."""
    woken: Woken = []
    woken_at: list[float] = []

    def wake(key: tuple[str, str]) -> None:
        woken.append(key)
        woken_at.append(time.monotonic())

    def every_job_woken(_: CountingPoller, woken: Woken) -> bool:
        return len(woken) >= len(targets)

    done = until or every_job_woken

    async def scenario() -> tuple[CountingPoller, float]:
        poller = CountingPoller(
            wake, networks=parse_networks("127.0.0.0/8"), interval=30, deadline=deadline
        )
        for key, target in targets.items():
            poller.track(key, target)
        started = time.monotonic()
        task = asyncio.create_task(poller.run())
        while not done(poller, woken) and time.monotonic() - started < wait:
            await asyncio.sleep(0.01)
        task.cancel()
        return poller, (woken_at[-1] if woken_at else time.monotonic()) - started

    poller, elapsed = asyncio.run(scenario())
    return poller, woken, elapsed


def reads(caplog: pytest.LogCaptureFixture) -> str:
    return "\n".join(r.getMessage() for r in caplog.records)


# --- authenticity and identity ------------------------------------------------------------------


def test_a_report_signed_with_the_jobs_key_is_read_and_wakes_the_job() -> None:
    who = identity(JOB_A)
    with runtime_server(status_document(who), KEY_A, who) as port:
        # 10.1.2.3 is outside the allowed networks: never contacted.
        targets = Targets(0, {0: ("127.0.0.1", port), 1: ("10.1.2.3", port)}, KEY_A)
        poller, woken, _ = poll_once({("team-a", "llm"): targets})
    assert woken == [("team-a", "llm")]
    found = poller.reports(("team-a", "llm"), attempt=0)
    assert set(found) == {0}
    assert found[0].nccl == ("PASS", "GDR on IB")
    assert found[0].progress == {"step": 7}


@pytest.mark.parametrize(
    ("key", "signed_as", "claims", "why"),
    [
        # hostNetwork jobs share the node's IP: job B's code answers where job A's worker
        # was asked, claiming A's identity, with the only key it has, its own.
        (KEY_B, identity(JOB_A), identity(JOB_A), "signature does not match"),
        # ... or says who it is, hoping the operator takes whatever comes back.
        (KEY_B, identity(JOB_B), identity(JOB_B), "signature does not match"),
        # A's own key, but for another attempt (a report of the gang before).
        (KEY_A, identity(JOB_A, attempt=1), identity(JOB_A, attempt=1), "signature does not match"),
        # A's own key, but another rank's (a pod IP now held by rank 1).
        (KEY_A, identity(JOB_A, rank=1), identity(JOB_A, rank=1), "signature does not match"),
        # Correctly signed, but the body speaks for another rank than the one asked.
        (KEY_A, identity(JOB_A), identity(JOB_A, rank=1), "speaks for"),
        (None, identity(JOB_A), identity(JOB_A), "not signed"),
    ],
    ids=["b-as-a", "b-as-itself", "other-attempt", "other-rank", "body-lies", "unsigned"],
)
def test_a_report_that_is_not_the_asked_workers_own_is_refused(
    key: bytes | None,
    signed_as: signatures.Identity,
    claims: signatures.Identity,
    why: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with runtime_server(status_document(claims), key, signed_as) as port:
        targets = Targets(0, {0: ("127.0.0.1", port)}, KEY_A)
        asked = {("team-a", "llm"): targets}
        poller, woken, _ = poll_once(asked, until=every_job_polled(asked))
    assert poller.polls == {("team-a", "llm"): 1}
    assert woken == []
    assert poller.reports(("team-a", "llm"), attempt=0) == {}
    assert "report refused" in reads(caplog)
    assert why in reads(caplog)


def test_a_captured_answer_replayed_later_is_refused(caplog: pytest.LogCaptureFixture) -> None:
    """Someone who saw one signed answer go by cannot serve it again: the nonce differs."""
    who = identity(JOB_A)
    body = json.dumps(status_document(who)).encode()
    captured = signatures.sign(KEY_A, who, "0123abcd", body)

    def replay(connection: socket.socket) -> None:
        connection.sendall(
            b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n%s: %s\r\n\r\n%s"
            % (len(body), contract.STATUS_SIGNATURE_HEADER.encode(), captured.encode(), body)
        )

    with raw_server(replay) as port:
        asked = {("team-a", "llm"): Targets(0, {0: ("127.0.0.1", port)}, KEY_A)}
        poller, woken, _ = poll_once(asked, until=every_job_polled(asked))
    assert poller.polls == {("team-a", "llm"): 1}
    assert woken == []
    assert "signature does not match" in reads(caplog)


def test_signed_fields_cannot_be_shifted_into_one_another() -> None:
    body = b"{}"
    one = signatures.sign(KEY_A, signatures.Identity("ab", "c", 0, 0), "00", body)
    other = signatures.sign(KEY_A, signatures.Identity("a", "bc", 0, 0), "00", body)
    assert one != other
    assert signatures.verify(KEY_A, signatures.Identity("ab", "c", 0, 0), "00", body, one)


def test_each_job_and_each_incarnation_of_a_name_has_its_own_key() -> None:
    assert KEY_A != KEY_B
    assert signatures.job_key(MASTER, "team-a", "llm", "uid-2") != KEY_A  # deleted, re-created
    assert signatures.job_key(b"x" * 32, *JOB_A) != KEY_A  # another operator installation


# --- bounds: redirects, size, time --------------------------------------------------------------


def test_a_redirect_is_not_followed() -> None:
    """A 302 to an address the networks check never saw: the operator does not go there."""
    visited = threading.Event()

    def elsewhere(connection: socket.socket) -> None:
        visited.set()

    with raw_server(elsewhere) as other:

        def redirect(connection: socket.socket) -> None:
            connection.sendall(
                b"HTTP/1.0 302 Found\r\nLocation: http://127.0.0.1:%d/status\r\n\r\n" % other
            )

        with raw_server(redirect) as port:
            with pytest.raises(FetchError, match=r"redirect .* not followed") as error:
                fetch("127.0.0.1", port, "/status", {}, deadline=2, max_bytes=1 << 20)
            time.sleep(0.2)
    assert error.value.outcome == "http_error"
    assert not visited.is_set()


def test_a_10_mib_answer_is_cut_off_at_the_cap() -> None:
    sent = []

    def huge(connection: socket.socket) -> None:
        connection.sendall(b"HTTP/1.0 200 OK\r\n\r\n")
        block = b"x" * 65536
        for _ in range(160):  # 10 MiB
            connection.sendall(block)
            sent.append(len(block))

    with raw_server(huge) as port:
        started = time.monotonic()
        with pytest.raises(FetchError, match="larger than 1048576 bytes") as error:
            fetch("127.0.0.1", port, "/status", {}, deadline=5, max_bytes=1 << 20)
        elapsed = time.monotonic() - started
        time.sleep(0.3)  # let the server notice the hang-up
    assert error.value.outcome == "too_large"
    assert elapsed < 2
    # The operator hung up: the server could not push all 10 MiB through (socket
    # buffers hold a few MiB at most on loopback).
    assert sum(sent) < 10 << 20


def slow_loris(connection: socket.socket) -> None:
    """A valid-looking answer, one byte every 0.1 s, forever: each read is fast."""
    for byte in b"HTTP/1.0 200 OK\r\nX-Padding: " + b"a" * 100_000:
        connection.sendall(bytes([byte]))
        time.sleep(0.1)


def test_a_slow_loris_is_abandoned_at_the_total_deadline() -> None:
    with raw_server(slow_loris) as port:
        started = time.monotonic()
        with pytest.raises(FetchError, match="within 1 s") as error:
            fetch("127.0.0.1", port, "/status", {}, deadline=1.0, max_bytes=1 << 20)
        elapsed = time.monotonic() - started
    assert error.value.outcome == "slow"
    assert 0.9 <= elapsed < 1.5


def test_a_slow_job_does_not_hold_back_another_jobs_reads() -> None:
    """Job B's worker is a slow-loris. Job A's report arrives as fast as if B were not
    there: well before B's deadline."""
    who = identity(JOB_A)
    with raw_server(slow_loris) as slow, runtime_server(status_document(who), KEY_A, who) as port:
        targets = {
            ("team-b", "vision"): Targets(0, dict.fromkeys(range(4), ("127.0.0.1", slow)), KEY_B),
            ("team-a", "llm"): Targets(0, {0: ("127.0.0.1", port)}, KEY_A),
        }
        # Stops once A is woken (within `wait`): B's reads cannot end before their 3 s
        # deadline, so waiting longer could not wake B either.
        _, woken, elapsed = poll_once(
            targets, deadline=3.0, wait=2.0, until=lambda _, woken: bool(woken)
        )
    assert woken == [("team-a", "llm")]
    assert elapsed < 1.0  # B's reads run to their 3 s deadline


def test_reads_do_not_use_the_executor_the_api_calls_share() -> None:
    """Every thread of the default executor (the reconciles' API calls) is busy, yet
    the status of a worker is read: the poller has a pool of its own."""
    who = identity(JOB_A)
    woken: list[tuple[str, str]] = []
    release = threading.Event()

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(max_workers=1))
        blocked = loop.run_in_executor(None, release.wait, 10)
        poller = StatusPoller(woken.append, networks=parse_networks("127.0.0.0/8"), interval=30)
        poller.track(("team-a", "llm"), Targets(0, {0: ("127.0.0.1", port)}, KEY_A))
        task = asyncio.create_task(poller.run())
        for _ in range(200):
            if woken:
                break
            await asyncio.sleep(0.01)
        task.cancel()
        release.set()
        await blocked

    with runtime_server(status_document(who), KEY_A, who) as port:
        asyncio.run(scenario())
    assert woken == [("team-a", "llm")]


@pytest.mark.parametrize("value", ["0.5", "0", "nan", "often"])
def test_the_status_interval_flag_refuses_less_than_a_second(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from trainwave import cli

    with pytest.raises(SystemExit) as exit_:
        cli.main(["operator", "--status-interval-seconds", value])
    assert exit_.value.code == 2
    assert f"{value!r}: expected a number of seconds, at least 1" in capsys.readouterr().err
