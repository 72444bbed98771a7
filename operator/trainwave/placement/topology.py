"""The topology tree: nodes grouped by label levels, highest first. Pure.

Built from `(levels, nodes)` alone, once per set of node labels, and shared read-only by
every snapshot taken while the labels stay the same. Free GPUs live on the snapshot, never
here (kueue keeps the same split between its topology tree and its per-cycle snapshot).

Levels, top to bottom:
  cluster          one root, so "anywhere" is a domain like any other
  <configured>     e.g. trainwave.io/spine, trainwave.io/rack; kubernetes.io/hostname may be
                   listed last, the node level is always there
  NVLink domain    from trainwave.io/nvlink-domain or nvidia.com/gpu.clique; left out when
                   every domain is a single node (HGX boards), where it would add nothing
  node             the leaves

The lowest level above NVLink domains and nodes is the "pipeline level" (the rack in the
usual setup): placement keeps the stages of one pipeline inside one of its domains.

Invariants:
- Nodes are numbered depth-first, so every domain covers one contiguous range of node
  indices, and ordering workers by node index puts topological neighbours side by side.
- A domain is identified by its path from the root, not by its label value alone: two racks
  labelled "r1" under two spines are two racks.
- A node missing a level's label is a domain of its own at that level. It never joins a
  stranger's rack, so a hard "within one rack" stays true on half-labelled clusters.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Final

from trainwave.contract import (
    NODE_LABEL_GPU_CLIQUE,
    NODE_LABEL_NVLINK_DOMAIN,
    NODE_LABEL_RACK,
    NODE_LABEL_SPINE,
)

HOSTNAME_LABEL: Final = "kubernetes.io/hostname"
DEFAULT_LEVELS: Final = (NODE_LABEL_SPINE, NODE_LABEL_RACK, HOSTNAME_LABEL)
# The first label present names a node's NVLink domain; GPU feature discovery sets the
# clique only on multi-node NVLink systems, our agent sets nvlink-domain everywhere.
DEFAULT_NVLINK_LABELS: Final = (NODE_LABEL_NVLINK_DOMAIN, NODE_LABEL_GPU_CLIQUE)
CLUSTER: Final = "cluster"
NVLINK: Final = "NVLink domain"
NODE: Final = "node"


@dataclass(frozen=True, slots=True)
class Level:
    """One level of the tree: the node label it groups by and how messages name it."""

    key: str  # "" for the cluster root and the NVLink level (several labels feed it)
    name: str


@dataclass(frozen=True, slots=True)
class Domain:
    """One group of nodes at one level; `first:stop` is its range of node indices."""

    level: int
    value: str
    parent: int  # index among the domains of the level above; -1 for the root
    children: tuple[int, ...]  # indices among the domains of the level below
    first: int
    stop: int


@dataclass(frozen=True, eq=False)
class Topology:
    levels: tuple[Level, ...]
    domains: tuple[tuple[Domain, ...], ...]  # per level, in node-index order
    node_names: tuple[str, ...]  # depth-first order
    # node_domains[level][node index] = index of the node's domain at that level.
    node_domains: tuple[tuple[int, ...], ...]
    nvlink_level: int | None  # None: every node is its own NVLink domain
    aliases: Mapping[str, int]  # label keys and level names a request may use

    @property
    def node_level(self) -> int:
        return len(self.levels) - 1

    @property
    def pipeline_level(self) -> int:
        """The lowest level above NVLink domains and nodes: the rack, usually."""
        below = self.nvlink_level if self.nvlink_level is not None else self.node_level
        return below - 1

    @cached_property
    def node_index(self) -> Mapping[str, int]:
        return {name: index for index, name in enumerate(self.node_names)}

    def level_of(self, name: str) -> int | None:
        """The level a request names, by label key ("trainwave.io/rack") or name ("rack")."""
        return self.aliases.get(name)

    def domain_of(self, node: int, level: int) -> Domain:
        return self.domains[level][self.node_domains[level][node]]

    def describe_levels(self) -> str:
        return ", ".join(level.name for level in self.levels[1:])


def level_name(key: str) -> str:
    """How a message names a level: the label's last path segment ("trainwave.io/rack" -> rack)."""
    if key == HOSTNAME_LABEL:
        return NODE
    return key.rsplit("/", 1)[-1]


def build_topology(
    levels: Sequence[str],
    nodes: Iterable[tuple[str, Mapping[str, str]]],
    nvlink_labels: Sequence[str] = DEFAULT_NVLINK_LABELS,
) -> Topology:
    """The tree of `nodes` (name, labels) under `levels` (label keys, highest first)."""
    configured = [key for key in levels if key != HOSTNAME_LABEL]
    if len(set(configured)) != len(configured):
        raise ValueError(f"topology levels repeat a label: {list(levels)}")
    if set(configured) & set(nvlink_labels):
        raise ValueError("NVLink labels form their own level; do not list them in levels")

    rows = [
        (
            tuple(_value(labels, key, name) for key in configured),
            _nvlink(labels, nvlink_labels, name),
            name,
        )
        for name, labels in nodes
    ]
    names = [name for _, _, name in rows]
    if len(set(names)) != len(names):
        raise ValueError("node names must be unique")
    # Single-node NVLink domains only restate the node level; dropping them keeps the
    # tree (and every placement decision over it) one level shorter.
    nvlink_sizes: dict[tuple[tuple[str, ...], str], int] = {}
    for path, domain, _ in rows:
        nvlink_sizes[(path, domain)] = nvlink_sizes.get((path, domain), 0) + 1
    with_nvlink = any(size > 1 for size in nvlink_sizes.values())
    paths = sorted(
        ((*path, domain, name) if with_nvlink else (*path, name) for path, domain, name in rows),
        key=lambda path: tuple(_natural(part) for part in path),
    )

    level_list = [Level("", CLUSTER)]
    level_list += [Level(key, level_name(key)) for key in configured]
    if with_nvlink:
        level_list.append(Level("", NVLINK))
    level_list.append(Level(HOSTNAME_LABEL, NODE))
    return _assemble(tuple(level_list), paths, with_nvlink, nvlink_labels)


def _assemble(
    levels: tuple[Level, ...],
    paths: list[tuple[str, ...]],
    with_nvlink: bool,
    nvlink_labels: Sequence[str],
) -> Topology:
    """Group the sorted paths into domains, level by level, with parents and children."""
    count = len(paths)
    spans: list[list[tuple[str, int, int]]] = [[("", 0, count)]]
    for level in range(1, len(levels)):
        level_spans: list[tuple[str, int, int]] = []
        start = 0
        for index in range(1, count + 1):
            if index == count or paths[index][:level] != paths[start][:level]:
                level_spans.append((paths[start][level - 1], start, index))
                start = index
        spans.append(level_spans)

    node_domains: list[tuple[int, ...]] = []
    for level_spans in spans:
        owner = [0] * count
        for position, (_, first, stop) in enumerate(level_spans):
            owner[first:stop] = [position] * (stop - first)
        node_domains.append(tuple(owner))

    domains: list[tuple[Domain, ...]] = []
    for level, level_spans in enumerate(spans):
        below = spans[level + 1] if level + 1 < len(spans) else []
        children: list[list[int]] = [[] for _ in level_spans]
        for position, (_, first, _) in enumerate(below):
            children[node_domains[level][first]].append(position)
        domains.append(
            tuple(
                Domain(
                    level=level,
                    value=value,
                    parent=node_domains[level - 1][first] if level else -1,
                    children=tuple(children[position]),
                    first=first,
                    stop=stop,
                )
                for position, (value, first, stop) in enumerate(level_spans)
            )
        )

    aliases: dict[str, int] = {}
    for index, each in enumerate(levels):
        aliases[each.name] = index
        if each.key:
            aliases[each.key] = index
    # Asking for "one NVLink domain" where every node is its own means "one node".
    for key in (*nvlink_labels, "nvlink", NVLINK):
        aliases[key] = len(levels) - 2 if with_nvlink else len(levels) - 1
    return Topology(
        levels=levels,
        domains=tuple(domains),
        node_names=tuple(path[-1] for path in paths),
        node_domains=tuple(node_domains),
        nvlink_level=len(levels) - 2 if with_nvlink else None,
        aliases=aliases,
    )


def _value(labels: Mapping[str, str], key: str, node: str) -> str:
    value = labels.get(key)
    return value if value else f"(no {level_name(key)}: {node})"


def _nvlink(labels: Mapping[str, str], keys: Sequence[str], node: str) -> str:
    for key in keys:
        if labels.get(key):
            return labels[key]
    return f"(node {node})"  # no NVLink beyond the node: a domain of its own


_DIGITS = re.compile(r"(\d+)")


def _natural(text: str) -> tuple[tuple[int, str], ...]:
    """Sort key reading digit runs as numbers, so rack-2 comes before rack-10."""
    return tuple(
        (int(part), "") if part.isdigit() else (-1, part) for part in _DIGITS.split(text) if part
    )
