"""Benchmark: one worker evicted (a drain), replaced alone against gang recreation, in one run
on the real node (issue 26 item 2, the acceptance's "worker node drained").

The job of tests/e2e/test_worker_replacement_real_node.py: 2 workers x 2 processes of
examples/train/regression_ddp.py (DDP over gloo on CPUs), the runtime's in-place restarts on
(3), a checkpoint every EVERY steps on a hostPath. After the second checkpoint worker 1's pod
is evicted through the Eviction API, as `kubectl drain` does. The same job runs once per mode,
one after the other on the same cluster:
- `replace`: `runPolicy.workerReplacement.enabled: true` (the default): only worker 1 gets a
  new pod, worker 0 keeps its pod and re-enters torch's rendezvous;
- `recreate`: `enabled: false`: the gang is recreated (a new attempt, new pods).
All workers share the one real node, so "drained" here is the eviction of the worker's pod
without the node going away (the node is not cordoned: the new pod must go somewhere).

Per mode: seconds from the eviction to the first step of the new processes (rank 0's log,
kubelet timestamps) and where they go (fault_timeline.py): the old pod gone from the API, the
operator's decision (its Event), the new pod created, scheduled, init container done, worker
container started, the launcher's first line, the training processes' start (checkpoint
loaded) and the first step.

Run as root, with nothing else using the real node:
    flock /tmp/realnode.lock ~/.cache/trainwave/venv-py311/bin/python tests/benchmarks/bench_replace.py
Env: BENCH_REPLACE_MODES (default replace,recreate), BENCH_REPLACE_ROUNDS (default 3: the
modes alternate, so a change of the machine's load falls on both), BENCH_REPLACE_TAG (a
results suffix), BENCH_REPLACE_LOGS (every pod's log and the pods' JSON, per namespace;
default /tmp/bench-replace-logs).
Writes tests/benchmarks/results/replace[-TAG].{json,md}. The cluster is stopped at the end if
this run started it (TRAINWAVE_KEEP_CLUSTER=1 keeps it).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from kubernetes import client, config

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "tests"), str(REPO / "operator")]

from benchmarks.fault_timeline import PodWatch, render_markdown, timeline  # noqa: E402
from benchmarks.operator_cluster import fresh_namespace, real_node_cluster  # noqa: E402
from benchmarks.provenance import git_commit, write_results  # noqa: E402
from cluster.controlplane import Cluster  # noqa: E402
from e2e.conftest import install_release  # noqa: E402
from e2e.test_training import checkpoint_steps, training_job  # noqa: E402
from integration.trainwave_fixtures import apply, wait_for_phase, wait_until  # noqa: E402

RESULTS = REPO / "tests" / "benchmarks" / "results"
MODES = os.environ.get("BENCH_REPLACE_MODES", "replace,recreate").split(",")
TAG = os.environ.get("BENCH_REPLACE_TAG", "")
ROUNDS = int(os.environ.get("BENCH_REPLACE_ROUNDS", "3"))  # the modes alternate, ROUNDS times
LOGS = Path(os.environ.get("BENCH_REPLACE_LOGS", "/tmp/bench-replace-logs"))
STEPS, EVERY, STEP_SECONDS = 160, 10, 0.2


def job_for(mode: str, name: str, checkpoints: Path) -> dict[str, Any]:
    if mode not in ("replace", "recreate"):
        raise ValueError(f"BENCH_REPLACE_MODES: mode {mode!r}; accepted: replace, recreate")
    manifest = training_job(name, checkpoints, steps=STEPS, every=EVERY, step_seconds=STEP_SECONDS)
    manifest["spec"]["runtime"]["inPlaceRestarts"] = 3
    policy = manifest["spec"].setdefault("runPolicy", {})
    policy["workerReplacement"] = {"enabled": mode == "replace"}
    # torch's elastic agent and rendezvous log their rounds at INFO (LOGLEVEL): the timeline
    # reads when each node joined and when the round completed.
    manifest["spec"]["env"].append({"name": "LOGLEVEL", "value": "INFO"})
    return manifest


def evict(core: client.CoreV1Api, namespace: str, pod: str) -> None:
    """What `kubectl drain` does to each pod: an Eviction, honouring PodDisruptionBudgets."""
    body = client.V1Eviction(metadata=client.V1ObjectMeta(name=pod, namespace=namespace))
    core.create_namespaced_pod_eviction(pod, namespace, body)


def run_mode(cluster: Cluster, core: client.CoreV1Api, mode: str, round_: int) -> dict[str, Any]:
    namespace, name = f"replace-{mode}-{round_}", "gang"
    checkpoints = cluster.state_dir / "replace" / f"{mode}-{round_}"
    checkpoints.mkdir(parents=True, exist_ok=True)
    for old in checkpoints.iterdir():
        old.unlink()
    fresh_namespace(cluster, namespace)
    load_before = os.getloadavg()
    apply(cluster, namespace, job_for(mode, name, checkpoints))
    wait_until(lambda: [s for s in checkpoint_steps(checkpoints) if s >= 2 * EVERY], 400,
               "a second checkpoint")  # fmt: skip
    saved = checkpoint_steps(checkpoints)[-1]
    watch = PodWatch(core, namespace).start()
    victim = f"{name}-a0-worker-1"
    time.sleep(1)  # the watch has seen every pod before the fault
    fault = time.time()
    evict(core, namespace, victim)
    print(f"{mode}: evicted {victim} at {fault:.3f} (checkpoint {saved})", flush=True)
    try:
        done = wait_for_phase(cluster, namespace, name, ("Succeeded", "Failed"), timeout=600)
    finally:
        watch.stop()
    status = done["status"]
    found = timeline(
        cluster,
        core,
        namespace=namespace,
        name=name,
        mode=mode,
        fault=fault,
        watch=watch,
        keep_logs=LOGS / namespace,
    )
    result = {
        "mode": mode,
        "round": round_,
        "phase": status["phase"],
        "attempt": status.get("attempt"),
        "restarts": status.get("restarts"),
        "disruptions": status.get("disruptions"),
        "replacements": (status.get("replacements") or {}).get("total"),
        "checkpoint_before_fault": saved,
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        **found,
    }
    print(f"{mode} {round_}: {json.dumps(result, default=str)}", flush=True)
    cluster.kubectl("delete", "namespace", namespace, "--wait=false")
    return result


def main() -> int:
    if os.geteuid() != 0:
        print("bench_replace needs root (the real node)", file=sys.stderr)
        return 2
    with real_node_cluster() as cluster:
        install_release(cluster)
        api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
        core = client.CoreV1Api(api)
        runs = [run_mode(cluster, core, m, r) for r in range(ROUNDS) for m in MODES]
    result = {
        "benchmark": "replace",
        "commit": git_commit(),
        "conditions": {
            "workers": 2,
            "processes_per_worker": 2,
            "backend": "gloo (CPU)",
            "steps": STEPS,
            "checkpoint_every_steps": EVERY,
            "step_seconds": STEP_SECONDS,
            "fault": "worker 1's pod evicted (Eviction API) after the second checkpoint",
            "cpus": os.cpu_count(),
        },
        "runs": runs,
    }
    stem = "replace" + (f"-{TAG}" if TAG else "")
    write_results(RESULTS / stem, result, render_markdown(result))
    print(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    sys.exit(main())
