"""The seeded stream of gangs that bench_saturation.py feeds a full cluster. Pure.

A seed and a configuration give the same jobs, arrival times and run times every time.
The first `burst` jobs arrive at once and already ask for more nodes than the cluster
has; the rest arrive one by one (exponential gaps, seeded) at a rate that asks for more
node-seconds per second than the cluster serves (`overload`), so the queue stays deep
until the stream ends and every finished gang leaves room that a waiting gang should
take at once.

Sizes are whole nodes (1, 2, 4 or 8 workers x 8 GPUs), so a gang's room is nodes, and the
largest gangs are the ones a stream of small ones could starve. Each worker finishes
`run_seconds` after it starts Running (the kwok stage pod-sim-succeeded reads the
sim.trainwave.io annotations).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trainwave import contract

NODE_GPUS = 8
IMAGE = "bench/worker:1"
# (workers, weight): mostly small gangs, a steady share of 8-node ones.
SIZES = ((1, 4), (2, 3), (4, 2), (8, 1))
RUN_SECONDS = (20, 30, 45, 60)
# Per GPU, so CPU and memory never run out before GPUs (a node has 192 CPUs, 2 TiB).
CPU_PER_GPU = 16
MEMORY_GIB_PER_GPU = 128


@dataclass(frozen=True)
class StreamConfig:
    name: str
    topology: str  # tests/cluster/topologies/<topology>.yaml
    nodes: int  # nodes in that topology
    jobs: int
    burst: int  # jobs that arrive at second 0
    overload: float  # offered node-seconds per second over the cluster's nodes
    seed: int = 2027
    sizes: tuple[tuple[int, int], ...] = SIZES  # (workers, weight)
    runs: tuple[int, ...] = RUN_SECONDS


CONFIGS = {
    # A few minutes on 2 shared cores: 64 nodes, ~3x the cluster in the queue at once.
    "small": StreamConfig("small", "medium-64", 64, jobs=90, burst=45, overload=1.3),
    # The scale: the 1,024-node topology, the same mix (~20 min here).
    "large": StreamConfig("large", "large", 1024, jobs=900, burst=450, overload=1.3),
    # The small mix with short and long runs: protected gangs wait minutes for long runs
    # to end while short ones could use the held room (queueing.py rule 9, maxRunSeconds).
    "mixed-runs": StreamConfig(
        "mixed-runs", "medium-64", 64, jobs=90, burst=45, overload=1.3, runs=(15, 15, 120)
    ),
    # The shape at 1/16 the scale: gangs of 8 whole nodes, 30 s each, all at once.
    "uniform": StreamConfig(
        "uniform", "medium-64", 64, jobs=24, burst=24, overload=1.0, sizes=((8, 1),), runs=(30,)
    ),
}


@dataclass(frozen=True)
class SatJob:
    name: str
    workers: int  # = nodes: each worker takes a whole node
    run_seconds: int
    arrival: float  # seconds after the stream starts

    @property
    def gpus(self) -> int:
        return self.workers * NODE_GPUS

    @property
    def node_seconds(self) -> float:
        return self.workers * self.run_seconds


def make_stream(config: StreamConfig) -> list[SatJob]:
    rng = random.Random(config.seed)
    sizes = [s for s, _ in config.sizes]
    weights = [w for _, w in config.sizes]
    mean_node_seconds = (
        sum(s * w for s, w in config.sizes) / sum(weights) * sum(config.runs) / len(config.runs)
    )
    # Arrivals per second so that offered node-seconds per second = overload x nodes.
    rate = config.overload * config.nodes / mean_node_seconds
    jobs, now = [], 0.0
    for index in range(config.jobs):
        workers = rng.choices(sizes, weights)[0]
        run = rng.choice(config.runs)
        if index >= config.burst:
            now += rng.expovariate(rate)
        jobs.append(SatJob(f"sat-{index:03d}-{workers}n-{run}s", workers, run, round(now, 2)))
    return jobs


def training_job(job: SatJob, namespace: str, max_run_slack: int | None = None) -> dict[str, Any]:
    """`max_run_slack`: set runPolicy.maxRunSeconds to the run plus this much (the bound a
    user who knows the run time would state), which lets the queue backfill onto held room."""
    annotations = {contract.SIM_RESULT: "Succeeded", contract.SIM_RUN_FOR: f"{job.run_seconds}s"}
    run_policy = {} if max_run_slack is None else {"maxRunSeconds": job.run_seconds + max_run_slack}
    return {
        "apiVersion": contract.API_VERSION,
        "kind": contract.KIND,
        "metadata": {"name": job.name, "namespace": namespace},
        "spec": {
            "workers": job.workers,
            "gpusPerWorker": NODE_GPUS,
            "image": IMAGE,
            "command": ["python", "train.py"],
            "resources": {
                "requests": {
                    "cpu": str(CPU_PER_GPU * NODE_GPUS),
                    "memory": f"{MEMORY_GIB_PER_GPU * NODE_GPUS}Gi",
                }
            },
            "template": {"metadata": {"annotations": annotations}},
            **({"runPolicy": run_policy} if run_policy else {}),
        },
    }


def send_at_arrivals(
    send: Callable[[SatJob], object], stream: list[SatJob], t0: float
) -> dict[str, float]:
    """Send each job at its arrival time (seconds after t0), both sides alike; a job's
    arrival is when its create was sent, so a slow create delays the ones behind it as
    it would a user's script."""
    arrivals = {}
    for job in stream:
        delay = t0 + job.arrival - time.time()
        if delay > 0:
            time.sleep(delay)
        arrivals[job.name] = time.time() - t0
        send(job)
    return arrivals
