"""When a launcher starts torch's agent again: the rendezvous store's host was replaced."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from trainwave.runtime.launcher.rejoin import Rejoins, local_endpoint, store_lost, wait_for_store

pytestmark = pytest.mark.timeout(20)

LOST = "RendezvousConnectionError: The connection to the C10d store has failed."


def recorded(tmp_path: Path, message: object) -> Path:
    """An error file as torch's @record writes it (errors/error_handler.py)."""
    path = tmp_path / "agent-error.json"
    path.write_text(json.dumps({"message": {"message": message, "extraInfo": {}}}))
    return path


def test_a_lost_store_is_read_from_the_agents_error_file(tmp_path: Path) -> None:
    assert store_lost(recorded(tmp_path, LOST)) == LOST


@pytest.mark.parametrize(
    "message",
    ["RuntimeError: [gloo] Connection closed by peer", "ChildFailedError: train.py FAILED",
     "ValueError: RendezvousConnectionError: quoted by a user's script", 7, None],
)  # fmt: skip
def test_any_other_error_is_not_a_lost_store(tmp_path: Path, message: object) -> None:
    assert store_lost(recorded(tmp_path, message)) is None


def test_no_file_or_a_half_written_one_is_not_a_lost_store(tmp_path: Path) -> None:
    assert store_lost(tmp_path / "absent.json") is None
    half = tmp_path / "half.json"
    half.write_text('{"message": {"mess')
    assert store_lost(half) is None


def test_a_worker_that_does_not_host_the_store_starts_its_agent_again() -> None:
    assert Rejoins(hosts_store=False, limit=3).verdict(1, LOST, stopping=False) is None


@pytest.mark.parametrize(
    ("rejoins", "code", "lost", "stopping", "why"),
    [
        (Rejoins(False, 3), 0, None, False, "ended cleanly"),
        (Rejoins(False, 3), 1, None, False, "did not end on a lost rendezvous store"),
        (Rejoins(True, 3), 1, LOST, False, "hosts the rendezvous store"),
        (Rejoins(False, 3), 143, LOST, True, "stopping"),
        (Rejoins(False, 3, used=3), 1, LOST, False, "3 times already (limit 3)"),
    ],
    ids=["clean", "other-error", "store-host", "stopping", "limit"],
)  # fmt: skip
def test_otherwise_the_launcher_exits_with_the_agents_code_and_says_why(
    rejoins: Rejoins, code: int, lost: str | None, stopping: bool, why: str
) -> None:
    found = rejoins.verdict(code, lost, stopping)
    assert found is not None
    assert why in found


def test_the_store_host_uses_loopback_with_its_port() -> None:
    assert local_endpoint("job-worker-0.job:29400") == "127.0.0.1:29400"
    assert local_endpoint("[fd00::1]:29400") == "127.0.0.1:29400"
    assert local_endpoint("no-port") == "no-port"  # torch then names the problem itself


class Tries:
    """A connect that fails `failures` times (as an old address or a missing name does)."""

    def __init__(self, failures: int) -> None:
        self.failures, self.calls, self.now = failures, 0, 0.0

    def connect(self, address: tuple[str, int], timeout: float) -> socket.socket:
        self.calls += 1
        self.now += timeout
        assert (address, timeout) == (("job-worker-0.job", 29400), 1.0)
        if self.calls <= self.failures:
            raise OSError("timed out")
        return socket.socket()


def test_waiting_for_the_store_tries_again_until_it_answers() -> None:
    tries = Tries(failures=3)
    found = wait_for_store("job-worker-0.job:29400", 60, connect=tries.connect,
                           clock=lambda: tries.now, pause=0)  # fmt: skip
    assert found == ("job-worker-0.job:29400", 4.0, "name")
    assert tries.calls == 4  # each try resolves the name again: a new connect


def test_waiting_for_the_store_ends_at_the_timeout_or_when_stopping() -> None:
    tries = Tries(failures=100)
    found = wait_for_store("job-worker-0.job:29400", 5, connect=tries.connect,
                           clock=lambda: tries.now, pause=0)  # fmt: skip
    assert found == (None, 5.0, "none")
    assert wait_for_store("job-worker-0.job:29400", 5, stopping=lambda: True,
                          connect=tries.connect, pause=0)[0] is None  # fmt: skip
    assert wait_for_store("no-port", 5) == (None, 0.0, "none")


class Network:
    """Which addresses answer, at which time; every connect is recorded."""

    def __init__(self, answers: dict[str, float]) -> None:
        self.answers = answers  # host -> from when it accepts
        self.now = 0.0
        self.tried: list[tuple[float, str]] = []

    def connect(self, address: tuple[str, int], timeout: float) -> socket.socket:
        host, port = address
        assert port == 29400
        self.tried.append((self.now, host))
        if self.now >= self.answers.get(host, float("inf")):
            return socket.socket()
        self.now += timeout
        raise OSError("timed out")


def test_an_announced_address_is_used_and_the_name_is_not_looked_up_before_the_wait() -> None:
    net = Network({"10.0.0.7": 3.0, "job-worker-0.job": 0.0})
    heard = {"address": None}

    def announced() -> str | None:
        net.now += 0.5  # the pause between tries
        if net.now >= 2.0:
            heard["address"] = "10.0.0.7"
        return heard["address"]

    found = wait_for_store("job-worker-0.job:29400", 300, announced=announced, name_after=30,
                           connect=net.connect, clock=lambda: net.now, pause=0)  # fmt: skip
    # The name would have answered at once (with what a DNS cache kept), but it is not
    # resolved before name_after: only the announced address is tried.
    assert found == ("10.0.0.7:29400", 3.5, "announced address")
    assert {host for _, host in net.tried} == {"10.0.0.7"}


def test_without_an_announcement_the_name_is_tried_after_the_wait() -> None:
    net = Network({"job-worker-0.job": 0.0})
    clock = {"now": 0.0}

    def tick() -> float:
        clock["now"] = max(clock["now"], net.now)
        return clock["now"]

    def sleep_less_announced() -> str | None:
        clock["now"] += 1.0  # time passes between tries
        net.now = clock["now"]
        return None

    found = wait_for_store("job-worker-0.job:29400", 300, announced=sleep_less_announced,
                           name_after=30, connect=net.connect, clock=tick, pause=0)  # fmt: skip
    assert found[0] == "job-worker-0.job:29400"
    assert 30 <= found[1] <= 31
    assert [t for t, _ in net.tried] == [found[1]]  # the name's first lookup, after 30 s


def test_an_announced_address_that_does_not_answer_falls_back_to_the_name() -> None:
    net = Network({"job-worker-0.job": 0.0})  # 10.0.0.1: the old pod, gone
    found = wait_for_store("job-worker-0.job:29400", 300, announced=lambda: "10.0.0.1",
                           name_after=30, connect=net.connect, clock=lambda: net.now,
                           pause=0)  # fmt: skip
    # From 30 s each try is the old address (a second's timeout), then the name.
    assert found == ("job-worker-0.job:29400", 31.0, "name")
    assert net.tried[-2:] == [(30.0, "10.0.0.1"), (31.0, "job-worker-0.job")]


def test_an_ipv6_announcement_is_bracketed_in_the_endpoint() -> None:
    net = Network({"fd00::7": 0.0})
    found = wait_for_store("job-worker-0.job:29400", 300, announced=lambda: "fd00::7",
                           name_after=30, connect=net.connect, clock=lambda: net.now)  # fmt: skip
    assert found == ("[fd00::7]:29400", 0.0, "announced address")


def test_an_address_announced_since_the_last_agent_started_is_taken_without_a_connect() -> None:
    net = Network({})  # the new store is not listening yet: torch's client will retry
    found = wait_for_store("job-worker-0.job:29400", 300, fresh=lambda: "10.0.0.8",
                           announced=lambda: "10.0.0.8", name_after=30, connect=net.connect,
                           clock=lambda: net.now)  # fmt: skip
    assert found == ("10.0.0.8:29400", 0.0, "announced address")
    assert net.tried == []
