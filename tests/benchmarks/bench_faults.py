"""Benchmark: faults injected into a training gang on the real node, in-place repair against
gang recreation, in one run (issue 26).

The chart is installed on the local cluster's real node (kubelet + containerd, as the e2e
tier does). The same job runs twice, one after the other, with the same seeded fault
schedule: 2 workers x 2 processes of tests/benchmarks/fault_worker.py (DDP over gloo on
CPUs, a checkpoint every CHECKPOINT_EVERY steps), under trainwave's runtime,
`runPolicy.hangTimeoutSeconds` set and straggler detection at its defaults:
- mode `in-place`: `spec.runtime.inPlaceRestarts: 3` (the default);
- mode `recreate`: `spec.runtime.inPlaceRestarts: 0`, so every repair recreates the gang;
- mode `in-place-cold` (not in the default modes): in place, with
  `spec.runtime.features.warmStart: off`, so each generation starts fresh interpreters.
Faults, injected from the host into one training process (picked by the seed):
- `kill`: SIGKILL;
- `stop`: SIGSTOP (the process hangs; its peers block in the next collective);
- `slow`: for SLOW_SECONDS the process gets half the CPU time it was using: a cgroup v1
  CPU quota of half its measured share, in 20 ms periods (fault_injection.py);
- `drain`: the pod of one worker (the seed picks which; worker 0 too) is evicted through the
  Eviction API, as `kubectl drain` does. With one real node (the default) all workers share
  it, so the node is not cordoned and the new pod comes back to it. With
  BENCH_FAULTS_NODES=3 each worker takes 5 of a node's 6 whole GPUs (one worker per node),
  the drained worker's node is cordoned first, and the new pod must go to the third node;
  other pods on the drained node (an operator pod, CoreDNS) stay, so the figure is the
  job's repair and not a leader failover besides. In place, the worker is replaced alone
  (runPolicy.workerReplacement, on by default; for worker 0, the store's host, the other
  workers' launchers start their agents again: runtime/launcher/rejoin.py); with
  inPlaceRestarts 0 the gang is recreated.
Per fault: time to detect (the first change the job's status shows: a new attempt, an
in-place restart, a Hung or Straggler condition naming it), time from the fault to the
first step of the new processes, steps lost; per run: goodput (distinct steps x healthy
step time / wall time from the job's creation to its last step, fault_analysis.py) and
what `status.goodput` said.

The runtime reports every REPORT_SECONDS and the operator reads the reports every
STATUS_INTERVAL seconds (the chart's runtime.statusIntervalSeconds, 15 by default), so a
slowed rank is judged on its reports, not on the polls: "reports to detect" is the time
from the slowdown to the Straggler condition over REPORT_SECONDS.

Run as root, with nothing else using the real node:
    flock /tmp/realnode.lock ~/.cache/trainwave/venv-py311/bin/python tests/benchmarks/bench_faults.py
The cluster is stopped at the end if this run started it (TRAINWAVE_KEEP_CLUSTER=1 keeps it).
Images must be current: `make images` first (`make bench-faults` does both).
Env: BENCH_FAULTS_SEED (default 26), BENCH_FAULTS_MODES (default in-place,recreate),
BENCH_FAULTS_KINDS (default kill,stop,slow,drain), BENCH_FAULTS_NODES (real nodes, default 1;
3 cordons the drained node). Writes tests/benchmarks/results/faults.{json,md}
(faults-3nodes.* with 3 nodes).
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "tests"), str(REPO / "operator")]

from benchmarks import fault_analysis as analysis  # noqa: E402
from benchmarks.fault_injection import (  # noqa: E402
    StatusWatch,
    evict_worker,
    inject,
    set_unschedulable,
    training_processes,
    worker_pod,
)
from benchmarks.fault_report import render_markdown  # noqa: E402
from benchmarks.operator_cluster import fresh_namespace, real_node_cluster  # noqa: E402
from benchmarks.provenance import git_commit, write_results  # noqa: E402
from cluster.controlplane import Cluster  # noqa: E402
from e2e.conftest import ON_REAL_NODE, WORKER_IMAGE, Release, install_release  # noqa: E402
from integration.trainwave_fixtures import apply, job_manifest  # noqa: E402
from trainwave import contract  # noqa: E402

RESULTS = REPO / "tests" / "benchmarks" / "results"
SEED = int(os.environ.get("BENCH_FAULTS_SEED", "26"))
MODES = os.environ.get("BENCH_FAULTS_MODES", "in-place,recreate").split(",")
KINDS = os.environ.get("BENCH_FAULTS_KINDS", "kill,stop,slow,drain").split(",")
WORKERS, PROCESSES = 2, 2
NODES = int(os.environ.get("BENCH_FAULTS_NODES", "1"))
# With a node to spare, a worker per node, and a drain cordons the node as kubectl does.
CORDON = NODES > WORKERS
# A real node has 8 GPUs, 2 of them kept for sharing by the e2e release (SHARED_GPUS):
# a worker of 5 leaves no room for a second one on its node.
GPUS_PER_WORKER = 5 if CORDON else 2
CHECKPOINT_EVERY = 20
HANG_TIMEOUT = 20  # the smallest hangTimeoutSeconds allows is 10
SLOW_SECONDS = 40
REPORT_SECONDS = 2  # TRAINWAVE_TELEMETRY_INTERVAL_SECONDS in the workers
STATUS_INTERVAL = 5  # the operator's --status-interval-seconds
DETECT_WAIT = 6 * STATUS_INTERVAL  # how long after a repair its status change is awaited
WARMUP_STEPS = 30  # healthy steps before the first fault and after each recovery
STEPS = 1500  # enough for the schedule at ~0.1 s a step; the job ends when it reaches them
SITE_PACKAGES = Path(sys.prefix) / "lib" / "python3.11" / "site-packages"


def worker_job(
    name: str, in_place: int, steps_dir: Path, checkpoints: Path, warm: str = "auto"
) -> dict[str, Any]:
    def host(volume: str, path: Path, mount: str, read_only: bool = True) -> tuple[dict, dict]:
        kind = "Directory" if read_only else "DirectoryOrCreate"
        return (
            {"name": volume, "hostPath": {"path": str(path), "type": kind}},
            {"name": volume, "mountPath": mount, "readOnly": read_only},
        )

    mounts = [
        host("torch", SITE_PACKAGES, "/usr/local/lib/python3.11/dist-packages"),
        host("bench", REPO / "tests" / "benchmarks", "/bench"),
        host("steps", steps_dir, "/steps", read_only=False),
        host("checkpoints", checkpoints, "/checkpoints", read_only=False),
    ]
    return job_manifest(
        name,
        workers=WORKERS,
        gpus=GPUS_PER_WORKER,
        result=None,
        image=WORKER_IMAGE,
        processesPerWorker=PROCESSES,
        command=["python", "/bench/fault_worker.py"],
        args=["--steps", str(STEPS), "--step-log", "/steps"],
        env=[
            {"name": contract.ENV_TELEMETRY_INTERVAL_SECONDS, "value": str(REPORT_SECONDS)},
            {"name": "OMP_NUM_THREADS", "value": "1"},
        ],
        runtime={
            "checkpoint": {"path": "/checkpoints", "everySteps": CHECKPOINT_EVERY, "keep": 3},
            "totalSteps": STEPS,
            "inPlaceRestarts": in_place,
            "features": {"warmStart": warm},
        },
        run_policy={
            "hangTimeoutSeconds": HANG_TIMEOUT,
            "failurePolicy": {"maxRestarts": 10},
        },
        template_spec={
            "nodeSelector": ON_REAL_NODE,
            "containers": [
                {"name": contract.WORKER_CONTAINER, "volumeMounts": [mount for _, mount in mounts]}
            ],
            "volumes": [volume for volume, _ in mounts],
        },
    )


def schedule(seed: int) -> list[tuple[str, int]]:
    """(kind, global rank) per fault, in KINDS order; the seed picks the ranks. A drain's
    rank is the first of the drained worker, any worker (worker 0 too, since it is replaced
    alone like the others)."""
    chooser = random.Random(seed)
    faults = []
    for kind in KINDS:
        rank = chooser.randrange(WORKERS * PROCESSES)
        if kind == "drain":
            rank = rank // PROCESSES * PROCESSES
        faults.append((kind, rank))
    return faults


def rank0_steps(steps_dir: Path) -> list[analysis.StepRecord]:
    return analysis.read_steps(steps_dir / "rank0.jsonl")


def wait_for(
    what: str,
    check: Callable[[], Any],
    timeout: float,
    every: float = 0.25,
    watch: StatusWatch | None = None,
) -> Any:
    """`check()`'s first truthy answer; fails at once when the watched job has Failed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if watch is not None and watch.phase() == "Failed":
            raise RuntimeError(f"{what}: the job Failed: {watch.last().get('message')}")
        if found := check():
            return found
        time.sleep(every)
    raise TimeoutError(f"{what}: not within {timeout:.0f} s")


def healthy_steps_after(steps_dir: Path, since: float, count: int) -> Callable[[], bool]:
    def enough() -> bool:
        records = rank0_steps(steps_dir)
        done = bool(records) and records[-1].step >= STEPS
        return done or sum(r.t > since for r in records) >= count

    return enough


def run_mode(cluster: Cluster, mode: str, faults: list[tuple[str, int]]) -> dict[str, Any]:
    namespace, name = f"faults-{mode}", "gang"
    work = cluster.state_dir / "faults" / mode
    steps_dir, checkpoints = work / "steps", work / "checkpoints"
    for directory in (steps_dir, checkpoints):
        directory.mkdir(parents=True, exist_ok=True)
        for old in directory.iterdir():
            old.unlink()
    fresh_namespace(cluster, namespace)
    in_place = 0 if mode == "recreate" else 3
    created = time.time()
    warm = "off" if mode == "in-place-cold" else "auto"
    apply(cluster, namespace, worker_job(name, in_place, steps_dir, checkpoints, warm))
    watch = StatusWatch(cluster.kubeconfig, namespace, name).start()
    results = []
    try:
        wait_for("first steps", healthy_steps_after(steps_dir, 0, WARMUP_STEPS), 600, watch=watch)
        for kind, rank in faults:
            print(f"{mode}: {kind} rank {rank}", flush=True)
            result = one_fault(
                cluster, namespace, name, kind=kind, rank=rank, steps_dir=steps_dir, watch=watch
            )
            results.append(result)
            print(f"{mode}: {result}", flush=True)
            wait_for(
                "healthy steps",
                healthy_steps_after(steps_dir, time.time(), WARMUP_STEPS),
                600,
                watch=watch,
            )
            if result.get("cordoned"):
                set_unschedulable(cluster.kubeconfig, result["node"], False)  # uncordon
        wait_for("the job's end", lambda: watch.phase() in ("Succeeded", "Failed"), 1800, every=1)
    finally:
        watch.stop()
    records = rank0_steps(steps_dir)
    fault_times = [r["at"] for r in results]
    step_seconds = analysis.healthy_step_seconds(records, fault_times) or 0.0
    final = watch.last()
    return {
        "mode": mode,
        "in_place_restarts_allowed": in_place,
        "phase": watch.phase(),
        "faults": results,
        "healthy_step_seconds": round(step_seconds, 4),
        "goodput": round(analysis.goodput(records, created, step_seconds), 4),
        "wall_seconds": round(max(r.t for r in records) - created, 1) if records else None,
        "status": {key: final.get(key) for key in ("attempt", "restarts", "goodput")},
        "timeline": watch.changes(),
    }


def one_fault(
    cluster: Cluster,
    namespace: str,
    name: str,
    *,
    kind: str,
    rank: int,
    steps_dir: Path,
    watch: StatusWatch,
) -> dict[str, Any]:
    """Inject one fault, wait for the repair (or, for a slowdown, for it to be named), and
    say what was measured."""
    (process,) = wait_for(
        f"rank {rank}'s process",
        lambda r=rank: training_processes(namespace, name, r),
        60,
        watch=watch,
    )
    fault_at = time.time()
    done = threading.Event()
    result: dict[str, Any] = {"kind": kind, "rank": rank, "pid": process, "at": fault_at}
    injector: threading.Thread | None = None
    if kind == "drain":
        result["pod"], result["node"] = evict_worker(
            cluster.kubeconfig, namespace, name, rank // PROCESSES, cordon=CORDON
        )
        result["cordoned"] = CORDON
    else:
        injector = inject(kind, process, done, SLOW_SECONDS)
    if kind == "slow":
        named = watch.wait_condition("Straggler", f"rank {rank}", fault_at, SLOW_SECONDS)
        result["detect_seconds"] = None if named is None else named - fault_at
        seen = result["detect_seconds"]
        result["reports_to_detect"] = None if seen is None else seen / REPORT_SECONDS
        end_fault(done, injector)
        return result
    records = wait_for(
        "the first new step",
        lambda at=fault_at: _recovered(steps_dir, at),
        900,
        every=0.5,
        watch=watch,
    )
    end_fault(done, injector)
    # the status may show the repair after it is over: wait for it, bounded
    detected = watch.wait_change_after(fault_at, DETECT_WAIT)
    result |= {
        "detect_seconds": None if detected is None else detected - fault_at,
        "recovery_seconds": records.seconds,
        "steps_lost": records.steps_lost,
        "last_step_before": records.last_step_before,
        "resumed_from": records.resumed_from,
    }
    if kind == "drain":
        moved = worker_pod(cluster.kubeconfig, namespace, name, rank // PROCESSES)
        result["moved_to"] = moved.spec.node_name
    return result


def poll_status_every(cluster: Cluster, release: Release, seconds: int) -> None:
    """Upgrade the release with runtime.statusIntervalSeconds = `seconds` and wait for an
    operator pod of the new revision to hold the leader Lease."""
    values = {**release.values}
    values["runtime"] = {**values.get("runtime", {}), "statusIntervalSeconds": seconds}
    release.upgrade(values, "faults-values.yaml")
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        pods = release.operator_pods()
        current = [
            p["metadata"]["name"]
            for p in pods
            if f'"{seconds}"' in json.dumps(p["spec"]["containers"][0].get("args", []))
            and p.get("status", {}).get("phase") == "Running"
        ]
        if len(current) == len(pods) and any(release.leader().startswith(n) for n in current):
            return
        time.sleep(1)
    raise TimeoutError(f"no operator with --status-interval-seconds {seconds} led within 180 s")


def end_fault(done: threading.Event, injector: threading.Thread | None) -> None:
    """Lift a fault that lasts (a stop, a slowdown) and wait for its thread."""
    done.set()
    if injector is not None:
        injector.join()


def _recovered(steps_dir: Path, fault_at: float) -> analysis.Recovery | None:
    found = analysis.recovery(rank0_steps(steps_dir), fault_at)
    return found if found.first_new_at is not None else None


def main() -> int:
    if os.geteuid() != 0:
        print("bench_faults needs root (the real node)", file=sys.stderr)
        return 2
    with real_node_cluster(NODES) as cluster:
        poll_status_every(cluster, install_release(cluster), STATUS_INTERVAL)
        faults = schedule(SEED)
        load_before = os.getloadavg()
        runs = [run_mode(cluster, mode, faults) for mode in MODES]
    result = {
        "benchmark": "faults",
        "commit": git_commit(),
        "seed": SEED,
        "schedule": faults,
        "conditions": {
            "workers": WORKERS,
            "processes_per_worker": PROCESSES,
            "real_nodes": NODES,
            "gpus_per_worker": GPUS_PER_WORKER,
            "drain": "cordon, then evict the worker's pod" if CORDON else "evict (not cordoned)",
            "backend": "gloo (CPU)",
            "checkpoint_every_steps": CHECKPOINT_EVERY,
            "hang_timeout_seconds": HANG_TIMEOUT,
            "slow": f"CPU quota of half the process's measured share for {SLOW_SECONDS} s",
            "report_seconds": REPORT_SECONDS,
            "status_interval_seconds": STATUS_INTERVAL,
            "cpus": os.cpu_count(),
            "load_before": load_before,
            "load_after": os.getloadavg(),
        },
        "runs": runs,
    }
    stem = "faults" if NODES == 1 else f"faults-{NODES}nodes"
    write_results(RESULTS / stem, result, render_markdown(result))
    print(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    sys.exit(main())
