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
- fewer than `limit` rejoins happened (spec.runtime.inPlaceRestarts): a store that never
  comes back ends the pod after `limit` x read_timeout, and the operator recreates the gang.

Pure but for `store_lost`, which reads the error file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

STORE_LOST = "RendezvousConnectionError"
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
    if isinstance(message, str) and message.startswith(STORE_LOST + ":"):
        return message
    return None


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
