"""The launcher's child, run until it ends: signals forwarded, and with in-place restarts,
torch's agent made to rejoin when the rendezvous store's host is replaced (rejoin.py).

Two ways to rejoin, one decision (`_rejoin`):
- in its own process: a warm-started agent asks through the report directory
  (rejoin.ask) and runs torch's agent again there, its forkserver kept;
- in a new process: any other agent ends on the lost store, and the launcher starts the
  child again with the endpoint it found.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from trainwave import contract
from trainwave.runtime.launcher import announce, rejoin
from trainwave.runtime.launcher.restarts import Monitor
from trainwave.runtime.settings import Settings

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
STOPPING = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)  # the pod is going away
# How long a launcher waits for a replaced worker 0's store before it starts the agent
# anyway (which then fails on its own timeout): the operator's replacement timeout default.
STORE_WAIT_SECONDS = 300.0
# How often the launcher looks for a warm agent's rejoin request while the agent runs.
REQUEST_POLL_SECONDS = 0.2


class Supervisor:
    def __init__(
        self,
        settings: Settings,
        monitor: Monitor,
        log: Callable[..., None],
        announcements: announce.Announcements | None = None,
    ) -> None:
        self.settings = settings
        self.monitor = monitor
        self.log = log
        self.announcements = announcements
        self.child: subprocess.Popen[bytes] | None = None
        self.stopping = False
        self.stopped_by = 0  # the first stopping signal received, 0 if none
        self._refused = False  # a rejoin was refused: the agent's end is final
        self._agent_started = float("-inf")  # the clock of announce.Heard.received

    def run(self, command: Sequence[str], env: Mapping[str, str]) -> int:
        in_place = self.settings.in_place
        rejoins = rejoin.Rejoins(hosts_store=in_place.hosts_store, limit=in_place.max_restarts)
        report_dir = self.settings.report_dir
        error_file = Path(env.get(rejoin.ERROR_ENV) or report_dir / rejoin.ERROR_FILE)
        endpoint = env.get(contract.ENV_PET_RDZV_ENDPOINT, "")  # by name, as the operator gave it
        previous = {sig: signal.signal(sig, self._forward) for sig in FORWARDED}

        def in_process(error: str) -> str | None:
            return self._rejoin(rejoins, endpoint, 1, rejoin.lost_store(error), "in process")

        try:
            while True:
                code = self._run_child(command, env, error_file, in_process)
                if not in_place.enabled or self._refused:
                    return self._exit_code(code)
                lost = rejoin.store_lost(error_file)
                reached = self._rejoin(rejoins, endpoint, code, lost, "new process")
                if reached is None:
                    return self._exit_code(code)
                env = {**env, contract.ENV_PET_RDZV_ENDPOINT: reached}
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _exit_code(self, code: int) -> int:
        """The child's code; but when the child is torch's elastic agent (in-place restarts)
        and the pod was stopped, 128 + the signal, as a process killed by it reports. The
        agent turns SIGTERM into a SignalException and exit 1
        (torch/distributed/elastic/multiprocessing/api.py _terminate_process_handler), which
        reads as the training's own failure; the operator takes a deleted pod's 143 as the
        deletion's doing (lifecycle/observed.py ended_by_deletion). A script run directly
        keeps its own code: a SIGTERM it does not handle gives 143 already."""
        if code != 0 and self.stopped_by and self.settings.in_place.enabled:
            return 128 + self.stopped_by
        return code

    def _forward(self, signum: int, _frame: object) -> None:
        if signum in STOPPING and not self.stopped_by:
            self.stopped_by = signum
        self.stopping = self.stopping or signum in STOPPING
        child = self.child
        if child is not None and child.poll() is None:
            child.send_signal(signum)

    def _rejoin(
        self, rejoins: rejoin.Rejoins, endpoint: str, code: int, lost: str | None, how: str
    ) -> str | None:
        """Where the agent meets the new store; None when it must not rejoin (rejoin.py)."""
        why_not = rejoins.verdict(code, lost, self.stopping)
        if why_not is not None:
            if lost is not None:
                self._refused = True
                self.log("rejoin-refused", reason=why_not, error=lost)
            return None
        rejoins.used += 1
        self.log(
            "rejoin",
            count=rejoins.used,
            limit=rejoins.limit,
            error=lost,
            how=how,
            action="wait for the new store host (worker 0 replaced), then run torch's "
            "elastic agent again",
        )
        accepting = self.announcements is not None and self.announcements.accepting
        reached, waited, via = rejoin.wait_for_store(
            endpoint,
            STORE_WAIT_SECONDS,
            announced=self._announced,
            fresh=lambda: self._announced(since=self._agent_started),
            name_after=announce.ANNOUNCE_WAIT_SECONDS if accepting else 0.0,
            stopping=lambda: self.stopping,
        )
        self.log(
            "store-reachable" if reached else "store-unreachable",
            endpoint=reached or endpoint,
            via=via,
            waited_seconds=round(waited, 3),
        )
        if self.stopping:  # the pod went away meanwhile: the agent must end, not rejoin
            self._refused = True
            return None
        return reached or endpoint  # unreached: the agent tries, and fails on its own timeout

    def _announced(self, since: float = float("-inf")) -> str | None:
        """The newest announced store address, if it was received after `since`."""
        heard = None if self.announcements is None else self.announcements.newest()
        return None if heard is None or heard.received <= since else heard.address

    def _run_child(
        self,
        command: Sequence[str],
        env: Mapping[str, str],
        error_file: Path,
        in_process: Callable[[str], str | None],
    ) -> int:
        report_dir = self.settings.report_dir
        with contextlib.suppress(OSError):  # unwritable: torch then only logs the error
            error_file.parent.mkdir(parents=True, exist_ok=True)
            error_file.unlink(missing_ok=True)  # only this child's error counts
            rejoin.clear_requests(report_dir)
        self._agent_started = time.monotonic()
        self.child = child = subprocess.Popen(list(command), env=dict(env))
        watched = self.settings.in_place.enabled
        if watched:
            self.monitor.start(child.pid)  # the child is torch's elastic agent
        try:
            while True:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    code = child.wait(timeout=REQUEST_POLL_SECONDS if watched else None)
                    break
                error = rejoin.take_request(report_dir)
                if error is None:
                    continue
                self.monitor.stop()  # the agent's processes are gone; it waits for us
                rejoin.answer(report_dir, in_process(error))
                self._agent_started = time.monotonic()
                self.monitor.start(child.pid)  # torch's agent again, in the same process
        finally:
            self.monitor.stop()
        return 128 - code if code < 0 else code


def describe(supervisor: Supervisor) -> dict[str, Any] | None:
    """/status "child"."""
    child = supervisor.child
    if child is None:
        return None
    return {"pid": child.pid, "running": child.poll() is None, "exit_code": child.poll()}
