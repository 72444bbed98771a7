"""Gangs the placer released that its watch cache has not seen released yet.

The placer decides from a watch-backed cache, and its own release patches come
back through the watch a little later. Until they do, a released pod still looks
gated (holding nothing) in the cache, and the next round would promise its room
to another gang: kube-scheduler would then refuse one of them ("Insufficient
nvidia.com/gpu") until the other is gone. So every pod the placer releases is
reserved here before its patch is sent (the patches run in the background, so a
round may start while they are in flight), counted on its node in every round,
until the cache shows it released, bound or gone, or its patch is refused. Nothing
here outlives the process: after a restart the cache is filled by a fresh LIST,
which already shows every release.

A gang placed before its pods exist (the placer's `place_now`: created pinned, no
gate) is reserved the same way, as "unborn", until the cache shows the pod at all (it
then counts on its pinned node, as every released pod does), its create is refused, or
UNBORN_SECONDS pass (a create that never came back).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from trainwave.api.trainingjob import JobKey
from trainwave.controller.clusterview import ClusterView
from trainwave.placement.records import PodRecord
from trainwave.placement.requirements import PodNeeds
from trainwave.placement.snapshot import ClusterSnapshot

PodKey = tuple[str, str]  # (namespace, name)
# The reconciler's own wait for a created pod's watch event (EXPECTATIONS_SECONDS).
UNBORN_SECONDS = 15.0


@dataclass(frozen=True)
class _Released:
    node: str
    needs: PodNeeds
    gpu_uuid: str
    gpu_mib: int
    job: JobKey | None  # where the cache's view files the pod; None: not a worker


def _job_of(pod: PodRecord) -> JobKey | None:
    return (pod.namespace, pod.worker.job) if pod.worker is not None else None


def _shows(pods_by_job: Mapping[JobKey, tuple[PodRecord, ...]], pod: _Released, name: str) -> bool:
    """Whether the view files this pod under its job (the view files workers only)."""
    return pod.job is not None and any(p.name == name for p in pods_by_job.get(pod.job, ()))


class Inflight:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._pods: dict[PodKey, _Released] = {}
        self._unborn: dict[PodKey, tuple[_Released, float]] = {}  # and until when
        self._clock = clock

    def __len__(self) -> int:
        return len(self._pods) + len(self._unborn)

    def add_unborn(self, pod: PodRecord, node: str) -> None:
        """A pod about to be created pinned to `node`: it holds room before it exists."""
        needs = PodNeeds(requests=pod.requests, host_ports=pod.host_ports)
        until = self._clock() + UNBORN_SECONDS
        released = _Released(node, needs, "", 0, _job_of(pod))
        self._unborn[(pod.namespace, pod.name)] = (released, until)

    def forget_unborn(self, namespace: str, name: str) -> None:
        """Its create was refused: the pod holds nothing after all."""
        self._unborn.pop((namespace, name), None)

    def add(self, pod: PodRecord, node: str, gpu_uuid: str = "", gpu_mib: int = 0) -> None:
        needs = PodNeeds(requests=pod.requests, host_ports=pod.host_ports)
        self._pods[(pod.namespace, pod.name)] = _Released(
            node, needs, gpu_uuid, gpu_mib, _job_of(pod)
        )

    def forget(self, pod: PodRecord) -> None:
        """A release patch the API server refused: the pod holds nothing after all."""
        self._pods.pop((pod.namespace, pod.name), None)

    def settle(self, view: ClusterView) -> None:
        """Forget the pods the cache now shows released or bound (holding), or gone.

        Looked up under each pod's own job, not in a set of every pod of the view: at
        8,000 workers on 4,096 nodes building those sets in every round was a fifth of the
        operator's CPU, for the few pods in flight."""
        if self._unborn:
            now = self._clock()
            self._unborn = {
                key: (pod, until)
                for key, (pod, until) in self._unborn.items()
                if until > now
                and not _shows(view.workers, pod, key[1])
                and not _shows(view.gated, pod, key[1])
            }
        if self._pods:
            self._pods = {
                key: pod for key, pod in self._pods.items() if _shows(view.gated, pod, key[1])
            }

    def covers(self, gang: Iterable[PodRecord]) -> bool:
        return any((p.namespace, p.name) in self._pods for p in gang)

    def apply(self, snapshot: ClusterSnapshot) -> ClusterSnapshot:
        """The snapshot with the released pods the cache does not show yet counted."""
        index = snapshot.topology.node_index
        unborn = (pod for pod, _ in self._unborn.values())
        for pod in (*self._pods.values(), *unborn):
            if pod.node in index:
                mib = {pod.gpu_uuid: pod.gpu_mib} if pod.gpu_uuid else {}
                snapshot = snapshot.with_workers(pod.needs, {pod.node: 1}, mib)
        return snapshot
