"""A worker's agent starts again when the rendezvous store's host is replaced (issue 26 item 2).

Worker 0's agent hosts torch's c10d rendezvous store (`is_host=true`, at the master
address; builders/runtime.py in_place_env). When worker 0's pod is lost and the
operator replaces it alone, every other worker's agent loses the store: its next store
operation fails, and torch wraps every such failure in RendezvousConnectionError
(torch/distributed/elastic/rendezvous/c10d_rendezvous_backend.py, `_call_store` and
`_create_tcp_store`), which ends the agent (launcher/api.py, launch_agent). That agent
cannot go on: its handler's store client stays bound to the dead server. A new agent can:
its handler connects to the master address again, where the new worker 0's agent serves a
fresh store under the same rendezvous id, so every agent starts at round 0 together
(torch's TCPStore client retries the connection until the rendezvous `read_timeout`, 60 s
by default, while the new pod starts).

So the launcher starts its agent again when, and only when:
- the agent ended with that error, as torch's `@record` wrote it to TORCHELASTIC_ERROR_FILE
  (errors/error_handler.py: "<type>: <message>"; a training process's own failure is copied
  there under its own type, so it never matches);
- this worker does not host the store (worker 0 losing its own store is not this case);
- the launcher is not stopping (a forwarded SIGTERM: the pod is going away);
- fewer than `limit` rejoins happened (spec.runtime.inPlaceRestarts): for a store that
  never comes back each rejoin waits (below) up to supervisor.STORE_WAIT_SECONDS, and the
  operator's replacement timeout recreates the gang first.

Cluster DNS decides how soon the new agent finds the new store: the worker's name keeps
its old address in DNS caches for up to their TTL (30 s in CoreDNS's usual `cache 30`),
and torch's TCPStore client spends its whole connection timeout (60 s) on the first
address it gets, which for the old pod's address answers nothing. Measured on three real
nodes: the new agents of both workers timed out that way and the gang was recreated. So:
- the new store host announces its address to the other workers (announce.py), and the
  agent starts again on that address when it answers;
- before starting the agent again, the launcher waits until the store accepts a TCP
  connection (`wait_for_store`): at the announced address, and, after
  announce.ANNOUNCE_WAIT_SECONDS without one, by the name too, each try resolving it
  again with a one-second connect timeout, so a stale address costs a second per try,
  not the whole timeout;
- the store's host never resolves its own name: its agent is given the loopback address
  with the same port (`local_endpoint`), since torch's TCPStore server listens on every
  interface and only its own client used the name.

A warm-started agent (warm.py) does not end on that error: it asks the launcher, through
two files in the report directory (`ask`, `take_request`, `answer`), whether and where to
rejoin, and runs torch's agent again in its own process, whose forkserver has imported
torch already. Measured on three real nodes, a new agent process spent 4 s importing
torch and its new forkserver 9 s more before the gang's first step.

Pure but for `store_lost`, the request files, and `wait_for_store`.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from trainwave.runtime import reports

STORE_LOST = "RendezvousConnectionError"
ANNOUNCED = "announced address"
ERROR_ENV = "TORCHELASTIC_ERROR_FILE"  # torch/distributed/elastic/multiprocessing/errors
ERROR_FILE = "agent-error.json"  # in the report directory, unless the job names its own


def store_lost(error_file: Path) -> str | None:
    """The agent's error when it ended because the rendezvous store went away, else None."""
    try:
        recorded = json.loads(error_file.read_text())
    except (OSError, ValueError):
        return None  # no error recorded (a signal, or a clean exit), or half written
    message = recorded.get("message") if isinstance(recorded, dict) else None
    if isinstance(message, dict):
        message = message.get("message")
    return lost_store(message) if isinstance(message, str) else None


def lost_store(message: str | None) -> str | None:
    """`message` when it says the rendezvous store went away, else None."""
    return message if message and message.startswith(STORE_LOST + ":") else None


REQUEST_FILE = "rejoin-request.json"  # the warm agent's question: why it lost the store
ANSWER_FILE = "rejoin-answer.json"  # the launcher's answer: where to rejoin, or not


def ask(
    report_dir: Path, error: str, *, alive: Callable[[], bool], poll: float = 0.1
) -> str | None:
    """The warm agent's side: the endpoint to rejoin at, or None (refused, or the
    launcher is gone)."""
    answer_path = report_dir / ANSWER_FILE
    answer_path.unlink(missing_ok=True)
    reports.write_json_atomic(report_dir / REQUEST_FILE, {"error": error})
    while alive():
        try:
            document = json.loads(answer_path.read_text())
        except (OSError, ValueError):  # not answered yet (the answer is written atomically)
            time.sleep(poll)
            continue
        answer_path.unlink(missing_ok=True)
        endpoint = document.get("endpoint") if isinstance(document, dict) else None
        return endpoint if isinstance(endpoint, str) and endpoint else None
    return None


def take_request(report_dir: Path) -> str | None:
    """The launcher's side: the error of a pending request, once; None without one."""
    path = report_dir / REQUEST_FILE
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    path.unlink(missing_ok=True)
    error = document.get("error") if isinstance(document, dict) else None
    return error if isinstance(error, str) else ""


def answer(report_dir: Path, endpoint: str | None) -> None:
    reports.write_json_atomic(report_dir / ANSWER_FILE, {"endpoint": endpoint})


def clear_requests(report_dir: Path) -> None:
    for name in (REQUEST_FILE, ANSWER_FILE):
        (report_dir / name).unlink(missing_ok=True)


@dataclass
class Rejoins:
    """How many times this launcher started its agent again, and whether it may once more."""

    hosts_store: bool
    limit: int
    used: int = 0

    def verdict(self, exit_code: int, lost: str | None, stopping: bool) -> str | None:
        """Why the agent must not start again; None when it must (the module docstring)."""
        if exit_code == 0:
            return "the agent ended cleanly"
        if lost is None:
            return "the agent did not end on a lost rendezvous store"
        if self.hosts_store:
            return "this worker hosts the rendezvous store"
        if stopping:
            return "the launcher is stopping"
        if self.used >= self.limit:
            return f"the agent started again {self.used} times already (limit {self.limit})"
        return None


def split_endpoint(endpoint: str) -> tuple[str, int] | None:
    """host and port of torch's `host:port` rendezvous endpoint; None without a port."""
    host, _, port = endpoint.rpartition(":")
    return (host.strip("[]"), int(port)) if host and port.isdigit() else None


def local_endpoint(endpoint: str) -> str:
    """The store host's own endpoint: loopback, same port (the module docstring)."""
    found = split_endpoint(endpoint)
    return endpoint if found is None else f"127.0.0.1:{found[1]}"


def wait_for_store(
    endpoint: str,
    timeout: float,
    *,
    announced: Callable[[], str | None] = lambda: None,
    fresh: Callable[[], str | None] = lambda: None,
    name_after: float = 0.0,
    stopping: Callable[[], bool] = lambda: False,
    connect: Callable[[tuple[str, int], float], socket.socket] = socket.create_connection,
    clock: Callable[[], float] = time.monotonic,
    pause: float = 0.5,
) -> tuple[str | None, float, str]:
    """The endpoint where the store accepted a connection within `timeout` s (None if it
    did not), after how long, and by what: "announced address", "name" or "none".
    An address announced since the last agent started (`fresh`) is taken at once, so the
    new agent imports torch while the new store starts (torch's store client retries a
    refused connection); any other announced address is tried with a connect first, at
    the endpoint's port; after `name_after` s the endpoint's name is too, resolved again
    each time (the module docstring)."""
    found = split_endpoint(endpoint)
    started = clock()
    if found is None:
        return None, 0.0, "none"
    name, port = found
    while not stopping():
        new = fresh()
        if new:
            return f"{bracketed(new)}:{port}", clock() - started, ANNOUNCED
        tries = [(announced(), ANNOUNCED)]
        if clock() - started >= name_after:
            tries.append((name, "name"))
        for host, via in ((h, v) for h, v in tries if h):
            try:
                connect((host, port), 1.0).close()
            except OSError:  # not resolvable yet, refused, or an old address: try again
                continue
            reached = endpoint if via == "name" else f"{bracketed(host)}:{port}"
            return reached, clock() - started, via
        if clock() - started >= timeout:
            break
        time.sleep(pause)
    return None, clock() - started, "none"


def bracketed(host: str) -> str:
    """A host as it goes before `:port`: an IPv6 address in brackets."""
    return f"[{host}]" if ":" in host else host
