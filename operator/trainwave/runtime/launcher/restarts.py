"""In-place restarts as one launcher sees them, and the hang watchdog.

torch's elastic agent (the launcher's child when in-place restarts are on)
restarts its training processes itself; the launcher only watches, from /proc
(processes.py) and the progress reports, and tells the operator in /status:

- a NEW GENERATION is a set of training processes none of which was in the
  last one. Its cause comes from torch's own counter: the agent gives each
  process TORCHELASTIC_RESTART_COUNT = max_restarts - remaining restarts, and
  spends a restart only when a LOCAL process failed; a restart because another
  worker's agent waits in the rendezvous is free (torch/distributed/elastic/
  agent/server/api.py, SimpleElasticAgent._invoke_run: "membership changes do
  not count as retries"). So: counter up -> "failure" ("hang" when this
  launcher's watchdog killed the processes), counter unchanged -> "peer".
- the HANG WATCHDOG: when no local rank has reported a completed step for
  hangTimeoutSeconds while its processes live, the launcher SIGKILLs its local
  training processes (SIGKILL ends a SIGSTOPped process too); the agent sees a
  failure and restarts the gang in place. It arms only once the generation has
  reported a step: start-up (imports, rendezvous, loading the checkpoint) is
  bounded by torch's own rendezvous and process-group timeouts instead.
- a NEW AGENT (the launcher starts torch's agent again when the rendezvous
  store's host was replaced: rejoin.py): the old generation's processes are
  gone with the old agent, so the watchdog waits for the new agent's first
  generation, and the restart it brings is counted from when the old one was
  seen to end. Found on three real nodes: the watchdog, still timing the old
  generation's last step, fired while the new agent imported torch.

Pure but for Monitor, the thread that feeds them from /proc and the report directory.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainwave.runtime import reports as report_files
from trainwave.runtime.launcher import processes
from trainwave.runtime.launcher.processes import EXITED, Worker
from trainwave.runtime.settings import InPlace

FAILURE, HANG, PEER = "failure", "hang", "peer"
CAUSES = (FAILURE, HANG, PEER)
Reports = Mapping[int, Mapping[str, Any]]  # progress report by global rank (tenant-written)
HISTORY = 20  # compute_history values relayed per rank (runtime/telemetry.py COMPUTE_HISTORY)


def classify(generation_before: int, generation_after: int, watchdog_killed: bool) -> str:
    """Why this pod's processes restarted (see the module docstring)."""
    if generation_after > generation_before:
        return HANG if watchdog_killed else FAILURE
    return PEER


def hang_due(now: float, timeout: float | None, last_step_at: float | None) -> bool:
    """True when the watchdog must act: armed (a step was seen) and silent for `timeout`."""
    return timeout is not None and last_step_at is not None and now - last_step_at >= timeout


def _number(value: Any) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    return float(value) if ok else None


def _integer(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _history(value: Any) -> list[float]:
    """A report's compute_history relayed as numbers only, its newest HISTORY values."""
    if not isinstance(value, list):
        return []
    return [n for item in value[-HISTORY:] if (n := _number(item)) is not None]


def of_generation(reports: Reports, pids: frozenset[int]) -> list[Mapping[str, Any]]:
    """The reports written by processes of the generation `pids`."""
    return [r for r in reports.values() if _integer(r.get("pid")) in pids]


def last_step_at(reports: Reports, pids: frozenset[int]) -> float | None:
    times = [t for r in of_generation(reports, pids) if (t := _number(r.get("time"))) is not None]
    return max(times, default=None)


@dataclass
class Restart:
    cause: str
    # When the fault was seen: the watchdog's kill, or a process gone. When the whole
    # restart fell between two looks, the old generation's last report: a lower bound, so
    # the recovery time is the gap in progress, never less than the real one.
    at: float
    step_before: int | None  # the last step the old generation reported here
    resumed_from: int | None = None  # the step the new generation started after
    first_step_at: float | None = None  # when it reported its first completed step

    def as_dict(self) -> dict[str, Any]:
        return dict(vars(self))


class Restarts:
    """The generations of this pod's training processes, counted by cause."""

    def __init__(self) -> None:
        self.count = 0
        self.causes = dict.fromkeys(CAUSES, 0)
        self.last: Restart | None = None
        self.pids: frozenset[int] = frozenset()  # the current generation's processes
        self.generation = 0
        self._step: int | None = None  # the newest step of the current generation
        self._step_at: float | None = None  # the time of its report
        self._fault_at: float | None = None
        self._killed_at: float | None = None
        self._new_agent = False  # the agent was started again; no generation of it yet

    def observe(
        self, workers: list[Worker], reports: Reports, now: float, previous: Reports | None = None
    ) -> list[tuple[str, dict[str, Any]]]:
        """Take one look; returns the log events it implies ("restart", "resumed").

        `previous`: each rank's report from before its current process started, which
        holds the old generation's last step once the new one has reported."""
        events: list[tuple[str, dict[str, Any]]] = []
        alive = frozenset(w.pid for w in workers if w.state != EXITED)
        if alive & self.pids:
            # Members seen after the others (a warm-started process names itself only
            # after its fork) are of this generation: the agent starts the next one only
            # once every process of the last has stopped (SimpleElasticAgent._restart_workers
            # stops the workers, then starts new ones).
            self.pids |= {w.pid for w in workers if w.pid in alive
                          and w.generation == self.generation}  # fmt: skip
        old = of_generation(previous or {}, self.pids)
        for report in [*of_generation(reports, self.pids), *old]:
            step = _integer(report.get("step"))
            if step is not None and (self._step is None or step > self._step):
                self._step, self._step_at = step, _number(report.get("time"))
        replaced = bool(alive) and not alive & self.pids  # a new generation runs
        if self.pids and self.pids - alive and self._fault_at is None and not replaced:
            self._fault_at = now  # seen between the fault and the new generation
        if replaced:
            generation = max(w.generation for w in workers if w.pid in alive)
            if self.pids:
                cause = classify(self.generation, generation, self._killed_at is not None)
                self.count += 1
                self.causes[cause] += 1
                at = self._killed_at or self._fault_at or self._step_at or now
                self.last = Restart(cause=cause, at=at, step_before=self._step)
                events.append(("restart", {"count": self.count, **self.last.as_dict()}))
            self.pids, self.generation = alive, generation
            self._step = self._step_at = self._fault_at = self._killed_at = None
            self._new_agent = False
        last = self.last
        if last is not None and last.first_step_at is None:
            fresh = of_generation(reports, self.pids)
            times = [t for r in fresh if (t := _number(r.get("time"))) is not None]
            firsts = [s for r in fresh if (s := _integer(r.get("first_step"))) is not None]
            if times:
                last.first_step_at = min(times)
                last.resumed_from = min(firsts) - 1 if firsts else None
                events.append(
                    (
                        "resumed",
                        {
                            **last.as_dict(),
                            "seconds_from_fault": round(last.first_step_at - last.at, 3),
                        },
                    )
                )
        return events

    def agent_started_again(self, now: float) -> None:
        """The launcher started a new agent: its first generation replaces the old one's
        processes, which ended with the old agent (at the latest, now)."""
        self._new_agent = True
        if self.pids and self._fault_at is None and self._killed_at is None:
            self._fault_at = now

    def hang_due(self, reports: Reports, now: float, timeout: float | None) -> bool:
        if self._killed_at is not None or not self.pids or self._new_agent:
            return False  # acted already, or a new agent: wait for the next generation
        return hang_due(now, timeout, last_step_at(reports, self.pids))

    def killed(self, now: float) -> None:
        self._killed_at = now

    def as_dict(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "causes": dict(self.causes),
            "last": None if self.last is None else self.last.as_dict(),
        }


def rank_entries(reports: Reports, state_of: Callable[[int], str]) -> dict[str, Any]:
    """/status "ranks": each local rank's last report and its process's state."""
    entries = {}
    for rank, report in sorted(reports.items()):
        pid = _integer(report.get("pid"))
        entries[str(rank)] = {
            "step": _integer(report.get("step")),
            "time": _number(report.get("time")),
            "step_seconds": _number(report.get("step_seconds")),
            "compute_seconds": _number(report.get("compute_seconds")),
            "compute_history": _history(report.get("compute_history")),
            "generation": _integer(report.get("generation")),
            "state": processes.UNKNOWN if pid is None else state_of(pid),
        }
    return entries


class Monitor:
    """Feeds Restarts from /proc and the reports every `interval` s; runs the watchdog."""

    def __init__(
        self,
        in_place: InPlace,
        report_dir: Path,
        log: Callable[..., None],
        *,
        interval: float = 0.5,
        proc: Path = processes.PROC,
        clock: Callable[[], float] = time.time,
        kill: Callable[[int, int], None] = os.kill,
    ) -> None:
        self.in_place = in_place
        self.report_dir = report_dir
        self.restarts = Restarts()
        self.lock = threading.Lock()
        self._log, self._interval, self._proc = log, interval, proc
        self._clock, self._kill = clock, kill
        # warm-started processes name themselves there (warm_child.py)
        self._identities = report_dir / report_files.IDENTITY_DIR
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, agent_pid: int) -> None:
        """Watch `agent_pid`'s processes; again after stop() for an agent started anew."""
        self._stop.clear()
        if self._thread is not None:
            with self.lock:
                self.restarts.agent_started_again(self._clock())
        self._thread = threading.Thread(
            target=self._loop, args=(agent_pid,), name="trainwave-restarts", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _loop(self, agent_pid: int) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.poll(agent_pid)
            except Exception as error:  # a bad report or a /proc race must not stop watching
                self._log("monitor-error", error=repr(error))

    def poll(self, agent_pid: int) -> None:
        workers = processes.workers_of(agent_pid, self._proc, self._identities)
        reports = report_files.all_progress(self.report_dir)
        # Read after the current reports: a report moved aside in between is found here.
        previous = report_files.all_progress(self.report_dir, report_files.PREVIOUS_PREFIX)
        now = self._clock()
        with self.lock:
            events = self.restarts.observe(workers, reports, now, previous)
            due = self.restarts.hang_due(reports, now, self.in_place.hang_timeout_seconds)
            if due:
                self.restarts.killed(now)
        for event, fields in events:
            self._log(event, **fields)
        if due:
            self._kill_generation(workers, reports, now)

    def _kill_generation(self, workers: list[Worker], reports: Reports, now: float) -> None:
        stalled = {
            str(rank): _integer(r.get("step"))
            for rank, r in sorted(reports.items())
            if _integer(r.get("pid")) in self.restarts.pids
        }
        self._log(
            "hang",
            timeout_seconds=self.in_place.hang_timeout_seconds,
            last_steps=stalled,
            states={str(w.rank): w.state for w in workers},
            action="SIGKILL the local training processes; the elastic agent restarts the gang",
        )
        for worker in workers:
            with contextlib.suppress(ProcessLookupError):  # it exited meanwhile
                self._kill(worker.pid, signal.SIGKILL)

    def status(self) -> dict[str, Any]:
        reports = report_files.all_progress(self.report_dir)
        with self.lock:
            restarts = self.restarts.as_dict()
        return {
            "ranks": rank_entries(reports, lambda pid: processes.state_of(pid, self._proc)),
            "restarts": restarts,
        }
