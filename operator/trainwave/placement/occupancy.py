"""What the GPUs of a snapshot are doing, summed for dashboards. Pure.

Whole GPUs are counted per topology domain (spine, rack, NVLink domain...) as
allocated, free, or unavailable (on nodes closed to new pods: cordoned, not
Ready, held). The node level is left out: one series per node and state would
grow with the cluster, and per-node numbers belong to the device plugin's own
exporter. Shared GPUs are summed cluster-wide as idle milli-GPU and the part of
it that is fragmented: FGD's measure (fragmentation.py) over the shapes running
now (GPU memory and CPU) plus the default quarter, half and whole GPU, on each
node's free CPU, as the packer measures it (shared_tasks.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from trainwave.placement.fragmentation import MILLI
from trainwave.placement.shared_tasks import SharedShape, typical_measure
from trainwave.placement.sharing import shared_nodes
from trainwave.placement.snapshot import ClusterSnapshot, NodeInfo

ALLOCATED = "allocated"
FREE = "free"
UNAVAILABLE = "unavailable"


@dataclass(frozen=True, slots=True)
class DomainGpus:
    level: str  # the level's name: "cluster", "spine", "rack", "NVLink domain"
    domain: str  # the label value that names the domain ("cluster" for the root)
    state: str  # ALLOCATED, FREE or UNAVAILABLE
    gpus: int


@dataclass(frozen=True, slots=True)
class SharedFragmentation:
    gpus: int = 0  # GPUs offered for sharing
    idle_milli: int = 0  # their free milli-GPU, summed
    fragmented_milli: float = 0.0  # of that, what the typical next task could not use


def gpus_by_domain(snapshot: ClusterSnapshot) -> tuple[DomainGpus, ...]:
    """Whole GPUs per domain of every level above the node, by state."""
    topology = snapshot.topology
    counts: dict[tuple[int, int], list[int]] = {}
    for index, node in enumerate(snapshot.nodes):
        states = _states(node)
        for level in range(topology.node_level):
            tally = counts.setdefault((level, topology.node_domains[level][index]), [0, 0, 0])
            for i, value in enumerate(states):
                tally[i] += value
    rows = []
    for (level, domain), tally in sorted(counts.items()):
        name = topology.levels[level].name
        label = topology.domains[level][domain].value or name
        for state, gpus in zip((ALLOCATED, FREE, UNAVAILABLE), tally, strict=True):
            rows.append(DomainGpus(name, label, state, gpus))
    return tuple(rows)


def _states(node: NodeInfo) -> tuple[int, int, int]:
    """(allocated, free, unavailable) whole GPUs of one node."""
    used = min(node.used, node.gpus)
    open_ = node.schedulable and node.ready and not node.cordoned
    rest = node.gpus - used
    return used, rest if open_ else 0, 0 if open_ else rest


def shared_fragmentation(
    snapshot: ClusterSnapshot, active_requests: Iterable[SharedShape] = ()
) -> SharedFragmentation:
    """Idle and fragmented milli-GPU over every GPU offered for sharing.

    `active_requests` are the shapes of the pods pinned to shared GPUs now (what the
    cluster runs, the best guess of what comes next). Closed nodes count too: their
    idle memory is stranded all the same."""
    nodes = shared_nodes(snapshot)
    if not nodes:
        return SharedFragmentation()
    # Milli-GPU against the smallest shared GPU, as the packer measures (sharing.measure).
    size = min(g.memory_mib for n in nodes for g in n.gpus) or 1
    fgd = typical_measure(size, active_requests)
    idle = 0
    fragmented = 0.0
    for node in nodes:
        free = tuple(g.free_mib * MILLI // g.memory_mib if g.memory_mib else 0 for g in node.gpus)
        idle += sum(free)
        fragmented += fgd.of(node.gpu_model, node.cpu_free, free)
    return SharedFragmentation(sum(len(n.gpus) for n in nodes), idle, fragmented)
