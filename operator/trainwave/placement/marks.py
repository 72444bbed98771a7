"""Nodes marked slow: closed to new gangs until their mark expires. Pure.

When the operator replaces a straggler (runPolicy.stragglers.replace), it annotates
the straggler's node `trainwave.io/straggler-until=<RFC 3339>` and recreates the gang;
every placement round then closes the marked nodes to trainwave's gangs until that
time. An annotation and not a taint: other workloads, and kube-scheduler, still use
the node, and the mark lapses by itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from datetime import datetime

from trainwave import contract
from trainwave.placement.records import NodeRecord
from trainwave.placement.snapshot import ClusterSnapshot


def marks_of(nodes: Iterable[NodeRecord]) -> dict[str, datetime]:
    """node -> straggler-until, from the nodes' annotations."""
    return {n.name: n.straggler_until for n in nodes if n.straggler_until is not None}


def close_marked(
    snapshot: ClusterSnapshot, marks: Mapping[str, datetime], now: datetime
) -> ClusterSnapshot:
    """`snapshot` with every node marked until after `now` closed to new pods."""
    changed = {}
    for index, node in enumerate(snapshot.nodes):
        until = marks.get(node.name)
        if until is not None and until > now and node.schedulable:
            stamp = until.isoformat().replace("+00:00", "Z")
            why = f"a straggler ran here ({contract.ANNOTATION_STRAGGLER_UNTIL}={stamp})"
            changed[index] = replace(node, schedulable=False, closed_why=why)
    return snapshot.derive(changed) if changed else snapshot
