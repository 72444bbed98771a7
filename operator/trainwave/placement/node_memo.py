"""Snapshots round after round, rebuilding only the nodes that changed. Pure.

A placement round reads every node, and the operator runs a round for each gang it places at
creation: on 4,096 nodes, walking every node to find the few its last events touched was a
third of a round. The caller that knows which nodes changed since the memo's last snapshot
(the operator's cache, controller/clusterview.py) passes their names, and the snapshot is
patched at those positions only; without them every node is compared, which is still far
cheaper than building each one again.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence

from trainwave.placement.records import NodeRecord
from trainwave.placement.snapshot import (
    ClusterSnapshot,
    NodeInfo,
    NodeUsage,
    SlotMemo,
    node_info,
)
from trainwave.placement.topology import DEFAULT_LEVELS, DEFAULT_NVLINK_LABELS, Topology

__all__ = ["NodeInfoMemo", "snapshot_of"]


class NodeInfoMemo:
    """Each node's NodeInfo from the last snapshot, rebuilt only where its record or its
    usage changed. The watch cache hands out the very same record and usage objects for
    nodes nothing happened on, so a round on 1,000 nodes rebuilds the handful its last
    events touched instead of all of them (building every NodeInfo was a third of the
    operator's CPU at 500 jobs on 1,024 nodes). Equal objects count as unchanged too."""

    def __init__(self) -> None:
        self._known: dict[str, tuple[NodeRecord, NodeUsage | None, NodeInfo]] = {}
        self.rebuilt = 0  # NodeInfos built by the last call, for tests and profiling
        self.slots = SlotMemo()  # the same NodeInfos keep their slots too
        # The version of the caller's state the last snapshot was built from (its to set).
        self.seen = -1
        # Where each node is in the records of the last full pass, and the last snapshot's
        # nodes with the topology they are ordered by: what `patched` starts from.
        self._listed: dict[str, int] = {}
        self._last: tuple[Topology, tuple[NodeInfo, ...]] | None = None
        self._placed: tuple[Topology, dict[str, int]] | None = None

    def infos(self, nodes: Iterable[NodeRecord], usage: Mapping[str, NodeUsage]) -> list[NodeInfo]:
        """Every node's NodeInfo, in the order of `nodes`, each compared with the last."""
        # Updated in place: a fresh dict of fresh tuples per round was most of this loop
        # on 4,096 nodes, where nearly every node hits.
        known, infos, rebuilt = self._known, [], 0
        for record in nodes:
            used = usage.get(record.name)
            hit = known.get(record.name)
            if hit is not None and hit[0] is record and hit[1] is used:
                infos.append(hit[2])
                continue
            info, built = self._info(record, used, hit)
            rebuilt += built
            infos.append(info)
        if len(known) != len(infos):  # vanished nodes are forgotten
            seen = {info.name for info in infos}
            self._known = {name: entry for name, entry in known.items() if name in seen}
        self._listed = {info.name: at for at, info in enumerate(infos)}
        self.rebuilt = rebuilt
        return infos

    def patched(
        self,
        topology: Topology,
        nodes: Sequence[NodeRecord],
        usage: Mapping[str, NodeUsage],
        changed: Collection[str],
    ) -> tuple[NodeInfo, ...] | None:
        """The last snapshot's nodes with those named in `changed` rebuilt: `nodes` must be
        the same nodes as the last full pass's, in the same order (their records and usage
        may differ only where `changed` says). None when the last snapshot cannot be
        patched (another topology, other nodes): the caller makes a full pass."""
        last, placed = self._last, self._placed
        if last is None or last[0] is not topology or placed is None or placed[0] is not topology:
            return None
        if len(nodes) != len(self._listed):
            return None
        infos, positions, rebuilt = list(last[1]), placed[1], 0
        for name in changed:
            at, where = self._listed.get(name), positions.get(name)
            if at is None or where is None or nodes[at].name != name:
                return None
            record = nodes[at]
            infos[where], built = self._info(record, usage.get(name), self._known.get(name))
            rebuilt += built
        self.rebuilt = rebuilt
        result = tuple(infos)
        self._last = (topology, result)
        return result

    def remember(self, snapshot: ClusterSnapshot) -> None:
        """The snapshot just built: the next `patched` starts from its nodes."""
        topology = snapshot.topology
        if self._placed is None or self._placed[0] is not topology:
            self._placed = (topology, {name: at for at, name in enumerate(topology.node_names)})
        self._last = (topology, snapshot.nodes)

    def _info(
        self,
        record: NodeRecord,
        used: NodeUsage | None,
        hit: tuple[NodeRecord, NodeUsage | None, NodeInfo] | None,
    ) -> tuple[NodeInfo, int]:
        """The node's NodeInfo, reused when its record and usage equal the last; and 1 when
        it was built anew."""
        if hit is not None and hit[0] == record and hit[1] == used:
            info, built = hit[2], 0  # equal objects: unchanged
        else:
            info, built = node_info(record, used), 1
        self._known[record.name] = (record, used, info)
        return info, built


def snapshot_of(
    nodes: Sequence[NodeRecord],
    usage: Mapping[str, NodeUsage],
    *,
    levels: Sequence[str] = DEFAULT_LEVELS,
    nvlink_labels: Sequence[str] = DEFAULT_NVLINK_LABELS,
    topology: Topology | None = None,
    memo: NodeInfoMemo | None = None,
    changed: Collection[str] | None = None,
) -> ClusterSnapshot:
    """A snapshot from node records and per-node usage; `topology` is reused when the
    caller knows the labels did not change, and `memo` keeps the NodeInfos of nodes that
    did not change since the caller's last snapshot. `changed`: the names of the nodes
    whose record or usage may differ from the memo's last snapshot, when the caller knows
    them (no node came or went since); None: every node is compared."""
    if memo is None:
        infos = [node_info(record, usage.get(record.name)) for record in nodes]
        return ClusterSnapshot.of(infos, levels, nvlink_labels, topology)
    if topology is not None and changed is not None:
        patched = memo.patched(topology, nodes, usage, changed)
        if patched is not None:
            return ClusterSnapshot(topology, patched, _carried=memo.slots)
    snapshot = ClusterSnapshot.of(
        memo.infos(nodes, usage), levels, nvlink_labels, topology, carried=memo.slots
    )
    memo.remember(snapshot)
    return snapshot
