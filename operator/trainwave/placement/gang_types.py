"""What gang placement is asked and what it answers. Pure data.

A GangRequest (N workers x G GPUs, levels, parallelism, the worker's pod needs) goes
in; a Placement (each rank's node, the domains used at each level, whether the
preferred level was met) or an Unschedulable (a Blocker code and its sentence)
comes out. The algorithm that decides between them is gang.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from trainwave.api.reasons import Reason
from trainwave.contract import GPU_RESOURCE
from trainwave.placement import explain
from trainwave.placement.ranks import Parallelism
from trainwave.placement.requirements import (
    NOT_READY_TAINT,
    UNREACHABLE_TAINT,
    PodNeeds,
    Toleration,
)
from trainwave.placement.snapshot import Selector


class Blocker(StrEnum):
    """Why a gang cannot be placed; short enough for a condition's `reason`."""

    INVALID_REQUEST = Reason.INVALID_REQUEST
    NO_MATCHING_NODES = Reason.NO_MATCHING_NODES
    WORKER_TOO_LARGE = Reason.WORKER_TOO_LARGE
    NOT_ENOUGH_GPUS = Reason.NOT_ENOUGH_GPUS
    NOT_ENOUGH_RESOURCES = Reason.NOT_ENOUGH_RESOURCES  # CPU, memory or another resource is short
    PARALLELISM = Reason.PARALLELISM_DOES_NOT_FIT
    REQUIRED_LEVEL = Reason.REQUIRED_DOMAIN_TOO_SMALL
    TOPOLOGY_SPREAD = Reason.TOPOLOGY_SPREAD  # the worker's DoNotSchedule spread (spread.py)
    HELD = Reason.HELD_FOR_EARLIER_JOB  # the room is held for an earlier gang (queueing.py)


@dataclass(frozen=True)
class GangRequest:
    """N workers x G GPUs; levels by label key ("trainwave.io/rack") or name ("rack")."""

    name: str
    workers: int
    gpus_per_worker: int
    required_level: str | None = None
    preferred_level: str | None = None
    parallelism: Parallelism | None = None
    node_selector: Selector = field(default_factory=dict)  # extra label requirements (RDMA)
    # The worker's pod as kube-scheduler will see it; None: only `gpus_per_worker` GPUs,
    # the GPU taint and the default NoExecute tolerations (benchmarks and unit tests).
    pod: PodNeeds | None = None
    # Shared GPUs: MiB of one GPU per worker instead of whole GPUs (gpus_per_worker 0).
    shared_mib: int | None = None

    @property
    def gpus(self) -> int:
        return self.workers * self.gpus_per_worker

    @property
    def needs(self) -> PodNeeds:
        if self.pod is not None:
            return self.pod
        return _gpu_only(self.gpus_per_worker)


def _gpu_only(gpus: int) -> PodNeeds:
    return PodNeeds(
        requests=((GPU_RESOURCE, gpus),) if gpus else (),
        tolerations=(
            Toleration(GPU_RESOURCE, "Exists"),
            Toleration(NOT_READY_TAINT, "Exists", "", "NoExecute"),
            Toleration(UNREACHABLE_TAINT, "Exists", "", "NoExecute"),
        ),
    )


@dataclass(frozen=True)
class LevelUsage:
    level: str
    domains: tuple[str, ...]  # in rank order


@dataclass(frozen=True)
class PreferredRoom:
    """The roomiest domain of the preferred level when the gang did not fit in one."""

    level: str
    domain: str
    workers: int  # workers of this gang it had room for
    needed: int

    def describe(self, *, now: bool = False) -> str:
        return (
            f"no {self.level} {'has' if now else 'had'} room for "
            f"{explain.plural(self.needed, 'worker')} "
            f"(roomiest: {self.domain}, {self.workers})"
        )


@dataclass(frozen=True)
class Placement:
    job: str
    gpus_per_worker: int
    nodes: tuple[str, ...]  # nodes[rank]: where worker `rank` goes
    usage: tuple[LevelUsage, ...]  # each level below the cluster, top to bottom
    preferred_met: bool | None = None  # None: no preferred level was asked for
    # When the preferred level was missed: why, as this snapshot saw it.
    preferred_room: PreferredRoom | None = None

    def workers_by_node(self) -> dict[str, int]:
        workers: dict[str, int] = {}
        for node in self.nodes:
            workers[node] = workers.get(node, 0) + 1
        return workers

    def gpus_by_node(self) -> dict[str, int]:
        gpus: dict[str, int] = {}
        for node in self.nodes:
            gpus[node] = gpus.get(node, 0) + self.gpus_per_worker
        return gpus

    def domains(self, level: str) -> tuple[str, ...]:
        for usage in self.usage:
            if usage.level == level:
                return usage.domains
        raise KeyError(level)

    def describe(self) -> str:
        """'4 workers x 8 GPUs on 4 nodes, 1 rack (rack-03), 1 spine (spine-0)'."""
        parts = []
        for usage in reversed(self.usage):
            count = explain.plural(len(usage.domains), usage.level)
            named = f" ({', '.join(usage.domains)})" if len(usage.domains) <= 3 else ""
            parts.append(count if usage is self.usage[-1] else count + named)
        workers = explain.plural(len(self.nodes), "worker")
        why = f"; {self.preferred_room.describe()}" if self.preferred_room else ""
        return f"{workers} x {self.gpus_per_worker} GPUs on {', '.join(parts)}{why}"


@dataclass(frozen=True)
class Unschedulable:
    job: str
    code: Blocker
    reason: str
