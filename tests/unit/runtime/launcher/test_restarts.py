"""In-place restarts as the launcher sees them: /proc, generations and causes, the watchdog."""

from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path
from typing import Any

import pytest

from trainwave.runtime.launcher import processes
from trainwave.runtime.launcher.processes import Worker, parse_environ, parse_stat, workers_of
from trainwave.runtime.launcher.restarts import (
    Monitor,
    Restarts,
    classify,
    hang_due,
    rank_entries,
)
from trainwave.runtime.reports import keep_previous, progress_path, write_json_atomic
from trainwave.runtime.settings import InPlace

pytestmark = pytest.mark.timeout(30)


# --- /proc ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "pid", "comm", "state", "ppid"),
    [
        pytest.param("41 (python) S 7 41 1 0 -1", 41, "python", "running", 7, id="sleeping"),
        pytest.param("41 (python) R 7 41", 41, "python", "running", 7, id="running"),
        pytest.param(
            "42 (pt_main_thread) T 7 42", 42, "pt_main_thread", "stopped", 7, id="sigstop"
        ),
        pytest.param("43 (a) b) t 7 43", 43, "a) b", "stopped", 7, id="traced-parens-in-comm"),
        pytest.param("44 (x y) Z 7 44", 44, "x y", "exited", 7, id="zombie"),
        pytest.param("45 (p) ? 7 45", 45, "p", "unknown", 7, id="unknown-letter"),
    ],
)
def test_stat_lines(line: str, pid: int, comm: str, state: str, ppid: int) -> None:
    assert parse_stat(line) == processes.Stat(pid, comm, state, ppid)


@pytest.mark.parametrize("line", ["", "garbage", "12 python S 1", "x (p) S 1"])
def test_a_line_that_is_not_a_stat_is_refused(line: str) -> None:
    with pytest.raises(ValueError, match="stat"):
        parse_stat(line)


def test_environ_is_nul_separated_and_keeps_equals_in_values() -> None:
    assert parse_environ(b"RANK=3\0A=b=c\0\0NOEQUALS\0") == {"RANK": "3", "A": "b=c"}


def fake_process(proc: Path, pid: int, ppid: int, state: str, env: dict[str, str]) -> None:
    directory = proc / str(pid)
    directory.mkdir(parents=True)
    (directory / "stat").write_text(f"{pid} (python) {state} {ppid} {pid} 1 0")
    (directory / "environ").write_bytes(b"\0".join(f"{k}={v}".encode() for k, v in env.items()))


def test_the_agents_training_processes_are_its_children_with_a_restart_count(
    tmp_path: Path,
) -> None:
    fake_process(tmp_path, 10, 1, "S", {})  # the agent
    fake_process(tmp_path, 11, 10, "S", {"RANK": "2", "TORCHELASTIC_RESTART_COUNT": "1"})
    fake_process(tmp_path, 12, 10, "T", {"RANK": "3", "TORCHELASTIC_RESTART_COUNT": "1"})
    fake_process(tmp_path, 13, 10, "S", {"RANK": "9"})  # not started by the agent as a worker
    fake_process(tmp_path, 14, 11, "S", {"TORCHELASTIC_RESTART_COUNT": "1"})  # a loader worker
    assert workers_of(10, tmp_path) == [
        Worker(pid=11, rank=2, generation=1, state="running"),
        Worker(pid=12, rank=3, generation=1, state="stopped"),
    ]
    assert processes.state_of(12, tmp_path) == "stopped"
    assert processes.state_of(99, tmp_path) == "exited"


def test_warm_started_processes_are_the_forkservers_children_named_by_their_files(
    tmp_path: Path,
) -> None:
    proc, identities = tmp_path / "proc", tmp_path / "reports" / "processes"
    server_env = {"PATH": "/usr/bin"}  # a forked process's /proc environ is its server's
    fake_process(proc, 10, 1, "S", {})  # the agent
    fake_process(proc, 20, 10, "S", server_env)  # its forkserver
    fake_process(proc, 21, 20, "S", server_env)
    fake_process(proc, 22, 20, "T", server_env)
    fake_process(proc, 23, 20, "S", server_env)  # forked, its file not written yet
    fake_process(proc, 24, 21, "S", server_env)  # rank 0's loader worker: not a rank
    fake_process(proc, 30, 99, "S", server_env)  # another agent's process with a stale file
    write_json_atomic(identities / "21.json", {"rank": "0", "generation": "2"})
    write_json_atomic(identities / "22.json", {"rank": "1", "generation": "2"})
    write_json_atomic(identities / "24.json", {"rank": "0", "generation": "2"})
    write_json_atomic(identities / "30.json", {"rank": "5", "generation": "0"})
    (identities / "23.json").write_text("{")  # half a file: skipped, not a crash
    assert workers_of(10, proc, identities) == [
        Worker(pid=21, rank=0, generation=2, state="running"),
        Worker(pid=22, rank=1, generation=2, state="stopped"),
    ]
    assert workers_of(10, proc) == []  # without the files nothing names them


# --- causes and the watchdog ------------------------------------------------------------


@pytest.mark.parametrize(
    ("before", "after", "killed", "cause"),
    [
        pytest.param(0, 1, False, "failure", id="local-process-failed"),
        pytest.param(0, 1, True, "hang", id="watchdog-killed"),
        pytest.param(1, 1, False, "peer", id="another-worker-failed"),
        pytest.param(1, 1, True, "peer", id="peer-restart-won-the-race"),
    ],
)
def test_cause_follows_torchs_restart_counter(
    before: int, after: int, killed: bool, cause: str
) -> None:
    assert classify(before, after, killed) == cause


@pytest.mark.parametrize(
    ("now", "timeout", "last", "due"),
    [
        pytest.param(130.0, 20.0, 110.0, True, id="silent-for-the-timeout"),
        pytest.param(129.9, 20.0, 110.0, False, id="not-yet"),
        pytest.param(500.0, 20.0, None, False, id="not-armed-before-a-first-step"),
        pytest.param(500.0, None, 110.0, False, id="no-timeout-configured"),
    ],
)
def test_watchdog_decision(
    now: float, timeout: float | None, last: float | None, due: bool
) -> None:
    assert hang_due(now, timeout, last) is due


def workers(*pids: int, generation: int = 0, state: str = "running") -> list[Worker]:
    return [Worker(pid, rank, generation, state) for rank, pid in enumerate(pids)]


def report(pid: int, step: int, time: float, first_step: int = 1) -> dict[str, Any]:
    return {"pid": pid, "step": step, "time": time, "first_step": first_step}


def test_a_local_failure_then_resume_is_one_restart_with_its_figures() -> None:
    restarts = Restarts()
    assert restarts.observe(workers(11, 12), {}, now=100.0) == []  # the first generation
    old = {0: report(11, 120, 105.0), 1: report(12, 120, 105.1)}
    restarts.observe(workers(11, 12), old, now=106.0)
    restarts.observe(workers(12), old, now=107.0)  # rank 0's process died: the fault
    restarts.observe([], old, now=107.5)  # between generations
    events = restarts.observe(workers(21, 22, generation=1), old, now=110.0)
    assert events == [
        ("restart", {"count": 1, "cause": "failure", "at": 107.0, "step_before": 120,
                     "resumed_from": None, "first_step_at": None}),
    ]  # fmt: skip
    new = {0: report(21, 101, 118.0, first_step=101), 1: report(22, 101, 118.2, first_step=101)}
    (resumed,) = restarts.observe(workers(21, 22, generation=1), new, now=118.5)
    assert resumed[0] == "resumed"
    assert resumed[1]["resumed_from"] == 100
    assert resumed[1]["first_step_at"] == 118.0
    assert resumed[1]["seconds_from_fault"] == 11.0
    assert restarts.as_dict()["causes"] == {"failure": 1, "hang": 0, "peer": 0}
    assert restarts.observe(workers(21, 22, generation=1), new, now=119.0) == []  # once


def test_a_peer_restart_keeps_torchs_counter() -> None:
    restarts = Restarts()
    restarts.observe(workers(11, 12, generation=1), {}, now=1.0)
    (event,) = restarts.observe(workers(31, 32, generation=1), {}, now=2.0)
    assert event[1]["cause"] == "peer"
    assert restarts.count == 1


def test_the_watchdog_arms_on_a_step_fires_once_and_names_the_cause_hang() -> None:
    restarts = Restarts()
    restarts.observe(workers(11, 12), {}, now=100.0)
    assert not restarts.hang_due({}, 200.0, 20.0)  # no step yet: start-up is not a hang
    stale = {0: report(11, 50, 110.0), 1: report(12, 50, 109.0)}
    assert not restarts.hang_due(stale, 129.0, 20.0)
    assert restarts.hang_due(stale, 130.0, 20.0)
    restarts.killed(130.0)
    assert not restarts.hang_due(stale, 140.0, 20.0)  # acted: wait for the new generation
    (event,) = restarts.observe(workers(21, 22, generation=1), stale, now=131.0)
    assert (event[1]["cause"], event[1]["at"], event[1]["step_before"]) == ("hang", 130.0, 50)
    # The old generation's reports do not arm the new one's watchdog.
    assert not restarts.hang_due(stale, 500.0, 20.0)


def test_a_new_agent_silences_the_watchdog_until_its_generation_and_counts_a_peer_restart() -> None:
    # The store's host was replaced: the old agent ended with its processes, and the
    # launcher started a new one (rejoin.py), which imports torch and meets the new store.
    restarts = Restarts()
    restarts.observe(workers(11, 12, generation=2), {}, now=100.0)
    stale = {0: report(11, 137, 110.0), 1: report(12, 136, 110.0)}
    restarts.observe(workers(11, 12, generation=2), stale, now=111.0)
    restarts.agent_started_again(now=115.0)  # no observation saw the processes end
    restarts.observe([], stale, now=120.0)  # the new agent has no processes yet
    assert not restarts.hang_due(stale, 140.0, 20.0)  # 30 s after the last step: no hang
    (event,) = restarts.observe(workers(21, 22, generation=0), stale, now=141.0)
    # A membership change (torch's counter starts again in the new agent): "peer", from
    # when the old agent was seen to end, not from a watchdog that never acted.
    assert (event[1]["cause"], event[1]["at"], event[1]["step_before"]) == ("peer", 115.0, 137)
    fresh = {0: report(21, 121, 150.0, first_step=121), 1: report(22, 121, 150.0)}
    restarts.observe(workers(21, 22, generation=0), fresh, now=150.5)
    assert restarts.hang_due(fresh, 170.0, 20.0)  # the new generation is watched again


def test_reports_from_tenant_code_with_bad_values_do_not_break_the_tracker() -> None:
    restarts = Restarts()
    restarts.observe(workers(11), {}, now=1.0)
    bad: dict[int, dict[str, Any]] = {0: {"pid": 11, "step": "ten", "time": "now"}}
    restarts.observe(workers(11), bad, now=2.0)
    assert not restarts.hang_due(bad, 1e9, 20.0)
    entries = rank_entries({0: {"pid": "x", "step": True, "step_seconds": "slow"}}, lambda p: "?")
    assert entries == {"0": {"step": None, "time": None, "step_seconds": None,
                             "compute_seconds": None, "compute_history": [],
                             "generation": None, "state": "unknown"}}  # fmt: skip
    history = [0.1, "x", None, 0.2] + [0.3] * 30
    relayed = rank_entries({0: {"pid": 11, "compute_history": history}}, lambda p: "running")
    assert relayed["0"]["compute_history"] == [0.3] * 20  # numbers only, the newest 20


# --- the status document and the monitor, on a fake /proc --------------------------------


def test_status_holds_each_ranks_report_and_process_state(tmp_path: Path) -> None:
    proc, reports = tmp_path / "proc", tmp_path / "reports"
    fake_process(proc, 10, 1, "S", {})
    fake_process(proc, 11, 10, "S", {"RANK": "2", "TORCHELASTIC_RESTART_COUNT": "0"})
    fake_process(proc, 12, 10, "T", {"RANK": "3", "TORCHELASTIC_RESTART_COUNT": "0"})
    for rank, pid in ((2, 11), (3, 12)):
        write_json_atomic(
            progress_path(reports, rank),
            {**report(pid, 7, 50.0), "step_seconds": 0.4, "compute_seconds": 0.1,
             "compute_history": [0.12, 0.1], "generation": 0},
        )  # fmt: skip
    logged: list[tuple[str, dict[str, Any]]] = []
    killed: list[tuple[int, int]] = []
    clock = iter([60.0, 71.0])
    monitor = Monitor(
        InPlace(enabled=True, max_restarts=3, hang_timeout_seconds=20.0),
        reports,
        lambda event, **fields: logged.append((event, fields)),
        proc=proc,
        clock=lambda: next(clock),
        kill=lambda pid, sig: killed.append((pid, sig)),
    )
    monitor.poll(10)
    document = monitor.status()
    assert document["ranks"]["2"] == {"step": 7, "time": 50.0, "step_seconds": 0.4,
                                      "compute_seconds": 0.1,
                                      "compute_history": [0.12, 0.1], "generation": 0,
                                      "state": "running"}  # fmt: skip
    assert document["ranks"]["3"]["state"] == "stopped"
    assert document["restarts"] == {"count": 0, "causes": {"failure": 0, "hang": 0, "peer": 0},
                                    "last": None}  # fmt: skip
    assert killed == []
    monitor.poll(10)  # 21 s after the last step: the watchdog kills both local processes
    assert killed == [(11, signal.SIGKILL), (12, signal.SIGKILL)]
    ((event, fields),) = logged
    assert event == "hang"
    assert fields["last_steps"] == {"2": 7, "3": 7}
    assert fields["states"] == {"2": "running", "3": "stopped"}
    json.dumps(document)  # served as JSON


def test_a_restart_between_two_polls_counts_the_old_generations_last_report(
    tmp_path: Path,
) -> None:
    """The monitor polls every 0.5 s; a restart can be quicker. The old generation's last
    report, moved aside by the new process's first write, still gives step_before, and
    its time bounds when the fault was."""
    proc, reports = tmp_path / "proc", tmp_path / "reports"
    fake_process(proc, 10, 1, "S", {})
    for pid, rank in ((11, 0), (12, 1)):
        fake_process(proc, pid, 10, "S", {"RANK": str(rank), "TORCHELASTIC_RESTART_COUNT": "0"})
        write_json_atomic(progress_path(reports, rank), report(pid, 4, 50.0))
    logged: list[tuple[str, dict[str, Any]]] = []
    monitor = Monitor(InPlace(enabled=True, max_restarts=3), reports,
                      lambda event, **fields: logged.append((event, fields)),
                      proc=proc, clock=lambda: 60.0)  # fmt: skip
    monitor.poll(10)  # finds the generation
    monitor.poll(10)  # sees its step 4
    # Between two polls: steps 5 and 6, rank 1 killed, the new generation started.
    for pid, rank in ((11, 0), (12, 1)):
        write_json_atomic(progress_path(reports, rank), report(pid, 6, 51.0))
        shutil.rmtree(proc / str(pid))
    for pid, rank in ((21, 0), (22, 1)):
        fake_process(proc, pid, 10, "S", {"RANK": str(rank), "TORCHELASTIC_RESTART_COUNT": "1"})
        keep_previous(reports, rank)  # what telemetry.Progress does before its first write
        write_json_atomic(progress_path(reports, rank), report(pid, 5, 58.0, first_step=5))
    monitor.poll(10)
    assert [event for event, _ in logged] == ["restart", "resumed"]
    assert (logged[0][1]["step_before"], logged[1][1]["resumed_from"]) == (6, 4)
    # No look saw the fault itself: it came after the old generation's last report.
    assert (logged[0][1]["at"], logged[1][1]["seconds_from_fault"]) == (51.0, 7.0)


def test_a_process_seen_after_the_others_joins_their_generation() -> None:
    """A warm-started process names itself after its fork, so one look can find rank 0 of
    a generation without rank 1; the watchdog must still judge by both ranks' steps."""
    restarts = Restarts()
    restarts.observe(workers(11), {}, now=100.0)  # rank 1 not named yet
    steps = {0: report(11, 5, 110.0), 1: report(12, 6, 120.0)}
    assert restarts.observe(workers(11, 12), steps, now=121.0) == []  # no restart
    assert restarts.pids == {11, 12}
    assert not restarts.hang_due(steps, 127.0, 8.0)  # rank 1 stepped at 120
    assert restarts.hang_due(steps, 128.0, 8.0)
