"""The supervisor's rejoin decision: where the agent meets the new store, or not at all."""

from __future__ import annotations

import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from trainwave.runtime.launcher import rejoin
from trainwave.runtime.launcher.restarts import Monitor
from trainwave.runtime.launcher.supervisor import Supervisor
from trainwave.runtime.settings import load_settings

pytestmark = pytest.mark.timeout(30)

LOST = "RendezvousConnectionError: The connection to the C10d store has failed."
ENV = {"PET_RDZV_BACKEND": "c10d", "PET_MAX_RESTARTS": "3", "PET_RDZV_CONF": "is_host=false"}


class Heard:
    def __init__(self, address: str, received: float) -> None:
        self.address, self.received = address, received


class Announcements:
    accepting = True

    def __init__(self, newest: Heard | None, on_read: Any = None) -> None:
        self._newest, self._on_read = newest, on_read

    def newest(self) -> Heard | None:
        if self._on_read is not None:
            self._on_read()
        return self._newest


def supervisor(tmp_path: Path, announcements: Any) -> tuple[Supervisor, list[tuple[str, dict]]]:
    settings = load_settings({**ENV, "TRAINWAVE_REPORT_DIR": str(tmp_path)})
    logged: list[tuple[str, dict]] = []
    monitor = Monitor(settings.in_place, tmp_path, lambda *a, **k: None)
    found = Supervisor(settings, monitor, lambda e, **f: logged.append((e, f)), announcements)
    return found, logged


def test_a_fresh_announcement_is_where_the_agent_rejoins(tmp_path: Path) -> None:
    found, logged = supervisor(tmp_path, Announcements(Heard("10.0.0.9", float("inf"))))
    rejoins = rejoin.Rejoins(hosts_store=False, limit=3)
    assert found._rejoin(rejoins, "j-worker-0.j:29400", 1, LOST, "in process") == "10.0.0.9:29400"
    assert rejoins.used == 1
    assert [event for event, _ in logged] == ["rejoin", "store-reachable"]


def test_a_pod_stopping_while_the_launcher_waits_does_not_rejoin(tmp_path: Path) -> None:
    found, logged = supervisor(tmp_path, None)

    def stop() -> None:
        found.stopping = True  # SIGTERM arrives while it waits for the new store

    found.announcements = Announcements(None, on_read=stop)
    rejoins = rejoin.Rejoins(hosts_store=False, limit=3)
    assert found._rejoin(rejoins, "j-worker-0.j:29400", 1, LOST, "in process") is None
    assert logged[-1][0] == "store-unreachable"


def test_the_store_host_and_other_errors_never_rejoin(tmp_path: Path) -> None:
    found, logged = supervisor(tmp_path, None)
    host = rejoin.Rejoins(hosts_store=True, limit=3)
    assert found._rejoin(host, "j-worker-0.j:29400", 1, LOST, "in process") is None
    assert logged == [("rejoin-refused", {"reason": "this worker hosts the rendezvous store",
                                          "error": LOST})]  # fmt: skip
    other = rejoin.Rejoins(hosts_store=False, limit=3)
    assert found._rejoin(other, "j-worker-0.j:29400", 1, None, "new process") is None
    assert other.used == 0


def test_the_agents_request_and_the_launchers_answer_pass_through_files(tmp_path: Path) -> None:
    rejoin.answer(tmp_path, "10.0.0.1:29400")  # a stale answer: ask() removes it first
    assert rejoin.take_request(tmp_path) is None
    calls = {"n": 0}

    def alive() -> bool:  # the launcher's side, between two of the agent's looks
        calls["n"] += 1
        if calls["n"] == 2:
            assert rejoin.take_request(tmp_path) == LOST
            assert rejoin.take_request(tmp_path) is None  # taken once
            rejoin.answer(tmp_path, "10.0.0.9:29400")
        return True

    assert rejoin.ask(tmp_path, LOST, alive=alive, poll=0) == "10.0.0.9:29400"
    assert not (tmp_path / rejoin.ANSWER_FILE).exists()
    rejoin.clear_requests(tmp_path)
    assert rejoin.ask(tmp_path, LOST, alive=lambda: False) is None  # the launcher is gone


@pytest.mark.parametrize(("child_exit", "expected"), [(1, 143), (0, 0)])
def test_a_child_that_ends_after_a_sigterm_reports_the_signal_s_code(
    tmp_path: Path, child_exit: int, expected: int
) -> None:
    # torch's agent (the child with in-place restarts) turns SIGTERM into exit 1 (its
    # SignalException); the launcher reports 143, as a process killed by SIGTERM would, so
    # a deleted pod does not read as failed.
    settings = load_settings({**ENV, "TRAINWAVE_REPORT_DIR": str(tmp_path)})
    monitor = Monitor(settings.in_place, tmp_path, lambda *a, **k: None)
    found = Supervisor(settings, monitor, lambda *a, **k: None)
    ready = tmp_path / "ready"
    child = (
        "import signal, sys, time, pathlib\n"
        f"signal.signal(signal.SIGTERM, lambda *a: sys.exit({child_exit}))\n"
        f"pathlib.Path({str(ready)!r}).touch()\n"
        "time.sleep(30)\n"
    )

    def stop_once_ready() -> None:
        while not ready.exists():
            time.sleep(0.02)
        found._forward(signal.SIGTERM, None)  # as the kubelet's SIGTERM reaches the launcher

    threading.Thread(target=stop_once_ready, daemon=True).start()
    assert found.run([sys.executable, "-c", child], {}) == expected
    assert found.stopped_by == signal.SIGTERM


def test_a_child_failing_on_its_own_keeps_its_code(tmp_path: Path) -> None:
    settings = load_settings({"TRAINWAVE_REPORT_DIR": str(tmp_path)})
    monitor = Monitor(settings.in_place, tmp_path, lambda *a, **k: None)
    found = Supervisor(settings, monitor, lambda *a, **k: None)
    assert found.run([sys.executable, "-c", "raise SystemExit(3)"], {}) == 3
    # Without in-place restarts the child is the user's script: its code is its own, even
    # after a SIGTERM (tests/host/runtime/launcher/test_launch.py, exit 7).
    found.stopped_by = signal.SIGTERM
    assert found._exit_code(7) == 7
