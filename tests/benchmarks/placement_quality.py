"""How well multi-node gangs were placed, the same way for every placer a benchmark compares.

Pure. A gang is *multi-node* when it asks for more GPUs than one node holds. For each such
gang a benchmark records whether some rack could have held it whole when it arrived (its
*room*) and the rack of every worker in rank order; from that come the share placed inside
one rack (overall and among gangs that had room), racks per gang, and cross-rack neighbour
pairs (ranks i and i+1 in different racks: the hops a ring all-reduce pays twice per step).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from itertools import pairwise

from trainwave.placement.gang_types import GangRequest
from trainwave.placement.snapshot import ClusterSnapshot


@dataclass
class Quality:
    """Multi-node jobs only; `room` = some rack could hold the whole gang when it arrived."""

    placed: int = 0
    room: int = 0
    one_rack_with_room: int = 0
    racks: list[int] = field(default_factory=list)
    cross_rack_pairs: int = 0

    def summary(self) -> dict[str, float | int]:
        return {
            "multi_node_jobs_placed": self.placed,
            "single_rack_share": round(self.racks.count(1) / max(1, self.placed), 4),
            "with_room_in_one_rack": self.room,
            "single_rack_share_when_room": round(self.one_rack_with_room / max(1, self.room), 4),
            "mean_racks_per_job": round(statistics.fmean(self.racks), 3) if self.racks else 0.0,
            "cross_rack_neighbour_pairs": self.cross_rack_pairs,
            "cross_rack_pairs_per_job": round(self.cross_rack_pairs / max(1, self.placed), 3),
        }

    def record(self, room: bool, racks_in_rank_order: list[int]) -> None:
        self.placed += 1
        self.room += room
        used = len(set(racks_in_rank_order))
        self.one_rack_with_room += room and used == 1
        self.racks.append(used)
        pairs = pairwise(racks_in_rank_order)
        self.cross_rack_pairs += sum(a != b for a, b in pairs)


class Fleet:
    """Per-node facts every placer shares: rack of each node, who matches each selector."""

    def __init__(self, snapshot: ClusterSnapshot):
        topology = snapshot.topology
        self.rack_level = topology.level_of("rack")
        assert self.rack_level is not None
        self.rack_of = topology.node_domains[self.rack_level]
        self.racks = len(topology.domains[self.rack_level])
        self.index = topology.node_index
        self.labels = [node.labels for node in snapshot.nodes]
        self._eligible: dict[tuple[tuple[str, str], ...], list[int]] = {}

    def eligible(self, request: GangRequest) -> list[int]:
        key = tuple(sorted(request.node_selector.items()))
        if key not in self._eligible:
            self._eligible[key] = [
                i for i, labels in enumerate(self.labels)
                if all(labels.get(k) == v for k, v in key)
            ]  # fmt: skip
        return self._eligible[key]

    def rack_has_room(self, free: list[int] | tuple[int, ...], request: GangRequest) -> bool:
        """Whole workers, not GPU totals: two half-free nodes do not hold one 8-GPU worker."""
        room = [0] * self.racks
        for node in self.eligible(request):
            room[self.rack_of[node]] += free[node] // request.gpus_per_worker
        return max(room) >= request.workers

    def racks_of(self, node_names: list[str]) -> list[int]:
        return [self.rack_of[self.index[name]] for name in node_names]
