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
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from trainwave.controller.clusterview import ClusterView
from trainwave.placement.records import PodRecord
from trainwave.placement.requirements import PodNeeds
from trainwave.placement.snapshot import ClusterSnapshot

PodKey = tuple[str, str]  # (namespace, name)


@dataclass(frozen=True)
class _Released:
    node: str
    needs: PodNeeds
    gpu_uuid: str
    gpu_mib: int


class Inflight:
    def __init__(self) -> None:
        self._pods: dict[PodKey, _Released] = {}

    def __len__(self) -> int:
        return len(self._pods)

    def add(self, pod: PodRecord, node: str, gpu_uuid: str = "", gpu_mib: int = 0) -> None:
        needs = PodNeeds(requests=pod.requests, host_ports=pod.host_ports)
        self._pods[(pod.namespace, pod.name)] = _Released(node, needs, gpu_uuid, gpu_mib)

    def forget(self, pod: PodRecord) -> None:
        """A release patch the API server refused: the pod holds nothing after all."""
        self._pods.pop((pod.namespace, pod.name), None)

    def settle(self, view: ClusterView) -> None:
        """Forget the pods the cache now shows released or bound (holding), or gone."""
        if not self._pods:
            return
        gated = {(p.namespace, p.name) for pods in view.gated.values() for p in pods}
        self._pods = {key: pod for key, pod in self._pods.items() if key in gated}

    def covers(self, gang: Iterable[PodRecord]) -> bool:
        return any((p.namespace, p.name) in self._pods for p in gang)

    def apply(self, snapshot: ClusterSnapshot) -> ClusterSnapshot:
        """The snapshot with the released pods the cache does not show yet counted."""
        index = snapshot.topology.node_index
        for pod in self._pods.values():
            if pod.node in index:
                mib = {pod.gpu_uuid: pod.gpu_mib} if pod.gpu_uuid else {}
                snapshot = snapshot.with_workers(pod.needs, {pod.node: 1}, mib)
        return snapshot
