"""The seeded arrival stream of gangs that bench_placement_vs_scheduler.py feeds to both placers.

Pure: a seed and a count give the same jobs, in the same order, with the same departures,
every time; the manifests for either placer are built from one `MixJob`, so a TrainingJob
worker and its plain-pod twin ask for exactly the same resources.

Jobs arrive one at a time. Job `i` stays for an exponentially distributed number of later
arrivals (seeded), then leaves: before job `departure` arrives it is deleted. With a mean
job of ~25 GPUs and a mean stay of MEAN_STAY arrivals, the 512 GPUs of medium-64 would hold
about 89% in steady state (Little's law); departures are bursty and some gangs find no room,
so with seed 2026 and 150 jobs the pure engine sees ~80% of GPUs in use on average after the
first MEAN_STAY arrivals and 98% at the peak (MEAN_STAY was chosen for that): busy enough that
racks fragment, while most of the time some rack has room for the next gang.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from trainwave import contract
from trainwave.placement.gang_types import GangRequest

NODE_GPUS = 8
MEAN_STAY = 18
# (workers, GPUs per worker, weight): mostly multi-node gangs of whole nodes, some of
# half nodes, and a few single workers that fragment nodes the way small jobs do.
SHAPES = (
    (1, 8, 8), (1, 4, 7),
    (2, 8, 20), (3, 8, 8), (4, 8, 18), (6, 8, 8), (8, 8, 6),
    (4, 4, 10), (6, 4, 7), (8, 4, 8),
)  # fmt: skip
# Per GPU, so CPU and memory never run out before GPUs (a node has 192 CPUs, 2 TiB).
CPU_PER_GPU = 16
MEMORY_GIB_PER_GPU = 128
IMAGE = "bench/worker:1"
# Plain pods of the kube-scheduler phase: these label their job and index (= rank).
PLAIN_JOB_LABEL = "bench.trainwave.io/job"
PLAIN_INDEX_LABEL = "bench.trainwave.io/index"


@dataclass(frozen=True)
class MixJob:
    name: str
    workers: int
    gpus_per_worker: int
    arrival: int  # position in the arrival order
    departure: int  # deleted before this arrival; past the end of the mix = stays

    @property
    def gpus(self) -> int:
        return self.workers * self.gpus_per_worker

    @property
    def multi_node(self) -> bool:
        """More GPUs than one node holds: where rack placement matters."""
        return self.gpus > NODE_GPUS

    def request(self) -> GangRequest:
        return GangRequest(self.name, self.workers, self.gpus_per_worker)


def make_mix(seed: int, count: int, mean_stay: float = MEAN_STAY) -> list[MixJob]:
    rng = random.Random(seed)
    weights = [weight for _, _, weight in SHAPES]
    jobs = []
    for arrival in range(count):
        workers, gpus, _ = rng.choices(SHAPES, weights)[0]
        stay = max(1, round(rng.expovariate(1 / mean_stay)))
        name = f"mix-{arrival:03d}-{workers}x{gpus}"
        jobs.append(MixJob(name, workers, gpus, arrival, arrival + stay))
    return jobs


def departures(jobs: list[MixJob]) -> dict[int, list[MixJob]]:
    """Arrival index -> the jobs to delete just before it."""
    leaving: dict[int, list[MixJob]] = {}
    for job in jobs:
        if job.departure < len(jobs):
            leaving.setdefault(job.departure, []).append(job)
    return leaving


def requests(job: MixJob) -> dict[str, str]:
    """CPU and memory of one worker; GPUs go in limits (extended resources)."""
    gpus = job.gpus_per_worker
    return {"cpu": str(CPU_PER_GPU * gpus), "memory": f"{MEMORY_GIB_PER_GPU * gpus}Gi"}


def training_job(job: MixJob) -> dict[str, Any]:
    """No sim annotations: the workers run until the job is deleted."""
    return {
        "apiVersion": contract.API_VERSION,
        "kind": contract.KIND,
        "metadata": {"name": job.name},
        "spec": {
            "workers": job.workers,
            "gpusPerWorker": job.gpus_per_worker,
            "image": IMAGE,
            "command": ["python", "train.py"],
            "resources": {"requests": requests(job)},
        },
    }


def plain_pods(job: MixJob) -> list[dict[str, Any]]:
    """The same gang as bare pods: no gate, no affinity, default kube-scheduler."""
    return [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{job.name}-{index}",
                "labels": {PLAIN_JOB_LABEL: job.name, PLAIN_INDEX_LABEL: str(index)},
            },
            "spec": {
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": contract.WORKER_CONTAINER,
                        "image": IMAGE,
                        "command": ["python", "train.py"],
                        "resources": {
                            "requests": requests(job),
                            "limits": {contract.GPU_RESOURCE: str(job.gpus_per_worker)},
                        },
                    }
                ],
            },
        }
        for index in range(job.workers)
    ]
