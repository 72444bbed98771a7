"""Where an in-place restart's time goes, on this host without Kubernetes (issue 26).

Two trainwave launchers ("workers" 0 and 1, as the operator starts them: torch's elastic
agent over c10d, node 0 hosting the rendezvous store) each run PROCESSES processes of
fault_worker.py (DDP over gloo on loopback, a checkpoint every CHECKPOINT_EVERY steps).
After WARMUP steps one training process is SIGKILLed; once every rank has completed a
step in the new generation, the run stops and the recovery is split into phases:

- agent_saw_failure: the failed worker's elastic agent logs the failed group;
- peer_saw_waiting: the other agent sees a node waiting in the rendezvous and restarts;
- rendezvous_done: the last agent's rendezvous round completed;
- started / imported / group / model / resumed / ddp / first_step: the new processes' own
  clocks (fault_worker.py's phases file): exec, `import torch` and the rest done, process
  group built, model and optimizer built (the optimizer imports torch._dynamo), checkpoint
  loaded, DDP wrapper built, first step completed.
Each is given in seconds after the fault, the latest rank's (the gang waits for it).

    ~/.cache/trainwave/venv-py311/bin/python tests/benchmarks/fault_phases.py [--repeat N]

Each repeat runs every `--warm` mode (spec.runtime.features.warmStart: auto forks each
generation from a forkserver that imported torch, off starts fresh interpreters), one
after the other, so both are measured under the same load.
Extra torchrun settings go through the PET_* environment (e.g. PET_MONITOR_INTERVAL).
Prints one JSON document; nothing is written to the repository.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "tests"), str(REPO / "operator")]

from benchmarks import fault_analysis as analysis  # noqa: E402
from benchmarks.fault_injection import training_processes  # noqa: E402
from trainwave import contract  # noqa: E402

PROCESSES = 2
CHECKPOINT_EVERY = 20
WARMUP = 25
STEPS = 100_000  # the run is stopped once recovered
# torch's agent log lines: "I1126 23:01:02.345678 1234 torch/distributed/...] message"
GLOG = re.compile(r"^[IWE](\d{4}) (\d\d):(\d\d):(\d\d\.\d+) ")
AGENT_EVENTS = {
    "agent_saw_failure": "Worker group FAILED",
    "peer_saw_waiting": "will restart worker group",
    "rendezvous_done": "Rendezvous complete for workers",
}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def launch(work: Path, node_rank: int, endpoint: str, warm: str) -> subprocess.Popen[str]:
    env = {
        "TRAINWAVE_FEATURE_WARM_START": warm,
        **{k: v for k, v in os.environ.items() if k.startswith("PET_")},
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(REPO / "operator"),
        "TRAINWAVE_REPORT_DIR": str(work / f"reports-{node_rank}"),
        "TRAINWAVE_PODINFO_DIR": str(work / "no-podinfo"),
        "TRAINWAVE_STATUS_HOST": "127.0.0.1",
        "TRAINWAVE_STATUS_PORT": "0",
        "TRAINWAVE_FEATURE_DOCTOR": "off",
        contract.ENV_JOB_NAMESPACE: "phases",
        contract.ENV_JOB_NAME: "gang",
        contract.ENV_ATTEMPT: "0",
        contract.ENV_CHECKPOINT_DIR: str(work / "checkpoints"),
        contract.ENV_CHECKPOINT_EVERY_STEPS: str(CHECKPOINT_EVERY),
        contract.ENV_TELEMETRY_INTERVAL_SECONDS: "1",
        contract.ENV_PET_NNODES: "2",
        contract.ENV_PET_NPROC_PER_NODE: str(PROCESSES),
        contract.ENV_PET_RDZV_BACKEND: "c10d",
        contract.ENV_PET_RDZV_ENDPOINT: endpoint,
        contract.ENV_PET_RDZV_ID: "phases-a0",
        contract.ENV_PET_MAX_RESTARTS: "3",
        contract.ENV_PET_RDZV_CONF: f"is_host={'true' if node_rank == 0 else 'false'}",
        "GLOO_SOCKET_IFNAME": "lo",
        "OMP_NUM_THREADS": "1",
        "LOGLEVEL": "INFO",  # torch's agent logs its rendezvous and restarts at INFO
    }
    command = [sys.executable, "-m", contract.RUNTIME_LAUNCHER, "--", sys.executable,
               str(REPO / "tests" / "benchmarks" / "fault_worker.py"), "--steps", str(STEPS),
               "--step-log", str(work / "steps")]  # fmt: skip
    log = (work / f"launcher-{node_rank}.log").open("w")
    return subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)


def glog_time(line: str, year: int) -> float | None:
    found = GLOG.match(line)
    if found is None:
        return None
    day, hour, minute, second = found.groups()
    stamp = time.strptime(f"{year}{day} {hour}:{minute}", "%Y%m%d %H:%M")
    return time.mktime(stamp) + float(second)


def agent_events(log: str, since: float) -> dict[str, float]:
    """The first time after `since` each AGENT_EVENTS line appears in one launcher's log."""
    year = time.localtime(since).tm_year
    found: dict[str, float] = {}
    for line in log.splitlines():
        at = glog_time(line, year)
        if at is None or at < since:
            continue
        for name, text in AGENT_EVENTS.items():
            if text in line and name not in found:
                found[name] = at
    return found


def new_generation(work: Path, ranks: int, fault_at: float) -> list[dict[str, Any]] | None:
    """Every rank's phases record of the generation started after the fault, or None."""
    found = []
    for rank in range(ranks):
        path = work / "steps" / f"phases-rank{rank}.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        records = [json.loads(line) for line in lines if line.strip()]
        fresh = [r for r in records if (r.get("started") or r["script"]) > fault_at]
        if not fresh:
            return None
        found.append(fresh[-1])
    return found


def one_run(victim: int, warm: str) -> dict[str, Any]:
    ranks = 2 * PROCESSES
    work = Path(tempfile.mkdtemp(prefix="fault-phases-"))  # kept: the launchers' logs
    if True:
        endpoint = f"127.0.0.1:{free_port()}"
        launchers = [launch(work, node, endpoint, warm) for node in (0, 1)]
        try:
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline:
                if any(launcher.poll() is not None for launcher in launchers):
                    raise RuntimeError(f"a launcher exited before the fault; logs in {work}")
                records = analysis.read_steps(work / "steps" / "rank0.jsonl")
                if len(records) >= WARMUP:
                    break
                time.sleep(0.2)
            else:
                raise TimeoutError(f"no warm-up steps within 600 s; logs in {work}")
            (pid,) = training_processes("phases", "gang", victim)
            fault_at = time.time()
            os.kill(pid, signal.SIGKILL)
            while (phases := new_generation(work, ranks, fault_at)) is None:
                if time.monotonic() > deadline + 300:
                    raise TimeoutError("no new generation within 300 s of the fault")
                time.sleep(0.2)
            step_before = [r for r in records if r.t <= fault_at][-1].step
        finally:
            for launcher in launchers:
                launcher.send_signal(signal.SIGTERM)
            for launcher in launchers:
                try:
                    launcher.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    launcher.kill()
        logs = [(work / f"launcher-{node}.log").read_text() for node in (0, 1)]
    seconds: dict[str, float] = {}
    for node_log in logs:
        for name, at in agent_events(node_log, fault_at).items():
            seconds[name] = max(seconds.get(name, 0.0), round(at - fault_at, 2))
    for name in ("started", "script", "imported", "group", "model", "resumed", "ddp", "first_step"):
        times = [r[name] for r in phases if r.get(name) is not None]
        if times:
            seconds[name] = round(max(times) - fault_at, 2)
    return {
        "warm_start": warm,
        "victim_rank": victim,
        "seconds_after_fault": seconds,
        "steps_lost": step_before - (phases[0]["step"] - 1),
        "load": os.getloadavg(),
    }


def medians(runs: list[dict[str, Any]]) -> dict[str, float]:
    names = {name for run in runs for name in run["seconds_after_fault"]}
    return {
        name: round(statistics.median(r["seconds_after_fault"].get(name, 0) for r in runs), 2)
        for name in sorted(names, key=lambda n: runs[0]["seconds_after_fault"].get(n, 0))
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument(
        "--warm",
        default="auto,off",
        help="warmStart modes to run, alternating in each repeat (default: auto,off)",
    )
    args = parser.parse_args()
    modes = [mode.strip() for mode in args.warm.split(",") if mode.strip()]
    runs = [
        one_run(victim=1 + 2 * (n % 2), warm=mode) for n in range(args.repeat) for mode in modes
    ]
    pet = {k: v for k, v in os.environ.items() if k.startswith("PET_")}
    median = {mode: medians([r for r in runs if r["warm_start"] == mode]) for mode in modes}
    print(json.dumps({"pet_env": pet, "median": median, "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
