"""The launcher's side of runPolicy.preflight: run the gang's bandwidth test, collect it.

Runs once per pod start, which is once per attempt (an in-place restart keeps the
pod and does not test again), before the user's command: `python -m
torch.distributed.run -m trainwave.runtime.preflight` with the gang's PET_*
variables, so the same processes per worker and the same backend take part.

Its own rendezvous, not the training one: torch's static rendezvous on rank 0's
MASTER_ADDR and a port of its own (MASTER_PORT + 1, or the next port no other part of
the job uses). Reusing the training endpoint would let a fast worker's training agent
join the store of rank 0's preflight agent just before that store closes. Nothing of
the user's runs yet, so the port is free.

A test that fails or outlasts TRAINWAVE_PREFLIGHT_TIMEOUT_SECONDS does not stop
training: its error is reported and the operator decides (lifecycle/preflight.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainwave import contract
from trainwave.runtime.preflight import RANK_GLOB

# torchrun's elastic variables: the test uses the static rendezvous instead.
_ELASTIC = (
    contract.ENV_PET_RDZV_BACKEND,
    contract.ENV_PET_RDZV_ENDPOINT,
    contract.ENV_PET_RDZV_ID,
    contract.ENV_PET_RDZV_CONF,
    contract.ENV_PET_LOCAL_ADDR,
)
MODULE = "trainwave.runtime.preflight"


@dataclass(frozen=True)
class PreflightConfig:
    size_mib: int
    timeout_seconds: float


def config_from(environ: Mapping[str, str]) -> PreflightConfig | None:
    """None when the job did not ask for a test (or asked with values that are not numbers:
    the launcher then trains and says why in its log)."""
    size = environ.get(contract.ENV_PREFLIGHT_SIZE_MIB)
    if not size:
        return None
    try:
        timeout = float(environ.get(contract.ENV_PREFLIGHT_TIMEOUT_SECONDS) or 120)
        return PreflightConfig(size_mib=max(1, int(size)), timeout_seconds=max(1.0, timeout))
    except ValueError:
        return None


def preflight_port(environ: Mapping[str, str]) -> int:
    """MASTER_PORT + 1, or the next port that is neither the status port nor the c10d
    rendezvous port; every worker computes the same from the same variables."""
    taken = {environ.get(contract.ENV_STATUS_PORT, str(contract.DEFAULT_STATUS_PORT))}
    endpoint = environ.get(contract.ENV_PET_RDZV_ENDPOINT, "")
    if ":" in endpoint:
        taken.add(endpoint.rsplit(":", 1)[1])
    master = environ.get(contract.ENV_PET_MASTER_PORT) or environ.get(contract.ENV_MASTER_PORT)
    port = int(master or contract.DEFAULT_MASTER_PORT) + 1
    while str(port) in taken:
        port += 1
    return port


def preflight_env(environ: Mapping[str, str]) -> dict[str, str]:
    env = {k: v for k, v in environ.items() if k not in _ELASTIC}
    master = environ.get(contract.ENV_PET_MASTER_ADDR) or environ.get(contract.ENV_MASTER_ADDR)
    if master:
        env[contract.ENV_PET_MASTER_ADDR] = master
    env[contract.ENV_PET_MASTER_PORT] = str(preflight_port(environ))
    env[contract.ENV_PET_MAX_RESTARTS] = "0"
    return env


def preflight_command() -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "-m", MODULE]


def read_ranks(report_dir: Path) -> dict[str, dict[str, Any]]:
    """This worker's ranks' figures, as the test processes wrote them."""
    ranks: dict[str, dict[str, Any]] = {}
    for path in sorted(report_dir.glob(RANK_GLOB)):
        try:
            found = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(found, dict) and isinstance(found.get("rank"), int):
            ranks[str(found["rank"])] = {
                key: found[key] for key in ("bus_gbps", "sendrecv_gbps") if key in found
            }
    return ranks


def run_preflight(
    config: PreflightConfig,
    environ: Mapping[str, str],
    report_dir: Path,
    attempt: int | None,
    publish: Callable[[dict[str, Any]], None],
) -> dict[str, Any]:
    """Run the test; `publish` sees the document while it runs and when it is done."""
    for stale in report_dir.glob(RANK_GLOB):  # a container restarted in the same pod
        stale.unlink(missing_ok=True)
    started = time.time()
    document: dict[str, Any] = {
        "attempt": attempt,
        "done": False,
        "ranks": {},
        "seconds": None,
        "error": None,
        "size_mib": config.size_mib,
    }
    publish(dict(document))
    error = None
    process = subprocess.Popen(
        preflight_command(), env=preflight_env(environ), start_new_session=True
    )
    try:
        code = process.wait(timeout=config.timeout_seconds)
        if code != 0:
            error = f"the test exited with code {code} (its log is above in the pod's log)"
    except subprocess.TimeoutExpired:
        error = f"the test did not finish within {config.timeout_seconds:g}s"
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    document.update(
        done=True,
        ranks=read_ranks(report_dir),
        seconds=round(time.time() - started, 3),
        error=error,
    )
    publish(document)
    return document
