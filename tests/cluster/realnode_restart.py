"""Restart a real node's kubelet, as a node's service manager restarts it after a crash or an
upgrade: the same command, environment and network namespace, a new process.

A kubelet that starts deletes every ResourceSlice of its node and registers the DRA
plugins it finds again: the fault behind the agent's slice watch
(tests/e2e/test_shared_training.py).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from cluster import processes
from cluster.components import Layout
from cluster.controlplane import STOP_GRACE, _locked, _read_state, _write_state, default_state_dir
from cluster.realnode_net import NodeNetwork, nsenter_prefix


def restart_kubelet(state_dir: Path | None = None, node: int = 1) -> int:
    """Stop real node `node`'s kubelet and start it again; returns the new pid. The command
    is the running one's own (/proc), so flags, labels and certificates stay the same."""
    layout = Layout((state_dir or default_state_dir()).resolve())
    with _locked(layout):
        state = _read_state(layout)
        if state is None:
            raise RuntimeError(f"no cluster runs in {layout.root}")
        name = f"tw-real-{node}/kubelet"
        record = next((p for p in state["processes"] if p["name"] == name), None)
        if record is None:
            raise RuntimeError(f"{layout.root} has no real node {node} (no process {name})")
        pid = int(record["pid"])
        argv = [part.decode() for part in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]]  # fmt: skip
        environment = dict(
            entry.decode().split("=", 1)
            for entry in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            if b"=" in entry
        )
        cwd = Path(os.readlink(f"/proc/{pid}/cwd"))
        processes.stop_groups([pid], STOP_GRACE)
        deadline = time.monotonic() + 10 * STOP_GRACE
        while processes.is_alive(pid):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} (pid {pid}) did not stop")
            time.sleep(0.1)
        # nsenter execs the kubelet, so the recorded process is the kubelet itself.
        command = nsenter_prefix(NodeNetwork(node)) + argv
        started = processes.spawn(name, command, Path(record["log"]), cwd, environment)
        record["pid"] = started.pid
        _write_state(layout, state)
        return started.pid
