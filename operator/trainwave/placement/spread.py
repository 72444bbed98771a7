"""The worker pod's own topology spread constraints, for a whole gang. Pure.

Mirrors kube-scheduler's PodTopologySpread plugin (k/k v1.34 pkg/scheduler/framework/
plugins/podtopologyspread):

- Counting (filtering.go `calPreFilterState`, common.go): a node takes part when it
  carries the topologyKey of every DoNotSchedule constraint and passes the node
  inclusion policies (nodeAffinityPolicy Honor: the pod's nodeSelector and required
  node affinity; nodeTaintsPolicy Honor: its NoSchedule/NoExecute taints tolerated).
  Each domain (a value of the key on such a node) counts the pods there in the pod's
  namespace that match the selector and are not terminating; a domain with no such
  pod counts 0.
- DoNotSchedule (filtering.go `Filter`): a worker may go to a node of domain d when
  count(d) + selfMatch - minMatch <= maxSkew, where minMatch is the smallest count
  over the domains, or 0 while there are fewer domains than minDomains.
- ScheduleAnyway (scoring.go): fewer matching pods in the node's domain score better;
  a node missing the key scores worst.

The difference is the gang. kube-scheduler decides pod by pod; trainwave pins all the
workers of a gang at once, so the check runs on the gang's distribution: each worker
is counted in its domain as it is added, and the distribution is accepted when every
worker passed the check at its turn, in an order that adds to the emptiest domains
first. Once released, a worker's required node affinity names its node, so under the
default nodeAffinityPolicy (Honor) kube-scheduler sees one domain and its own check
passes: honouring the constraint is trainwave's job.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from trainwave.placement import explain, filters
from trainwave.placement.filters import Rejection
from trainwave.placement.requirements import PodNeeds, SpreadConstraint, Taint
from trainwave.placement.snapshot import ClusterSnapshot, NodeInfo

_BLOCKING = ("NoSchedule", "NoExecute")
_MISSING = 1 << 20  # a soft score for nodes without the key: worse than any count


@dataclass
class _Counts:
    """One constraint's domains: node index -> domain, and the matching pods per domain."""

    constraint: SpreadConstraint
    domain_of: list[str | None]  # None: the node takes no part
    counts: dict[str, int]

    def minimum(self) -> int:
        if len(self.counts) < self.constraint.min_domains or not self.counts:
            return 0
        return min(self.counts.values())

    def skew_after(self, node: int) -> int | None:
        """The skew if one more worker went to `node`; None when the node takes no part."""
        domain = self.domain_of[node]
        if domain is None:
            return None
        own = 1 if self.constraint.self_match else 0
        return self.counts[domain] + own - self.minimum()

    def add(self, node: int, workers: int) -> None:
        domain = self.domain_of[node]
        if domain is not None and self.constraint.self_match:
            self.counts[domain] += workers


class SpreadState:
    """The counts of every spread constraint of one pod shape over one snapshot."""

    def __init__(self, snapshot: ClusterSnapshot, needs: PodNeeds):
        self.needs = needs
        hard_keys = [c.topology_key for c in needs.spread if c.hard]
        self.hard = [_count(snapshot.nodes, needs, c, hard_keys) for c in needs.spread if c.hard]
        self.soft = [
            _count(snapshot.nodes, needs, c, [c.topology_key]) for c in needs.spread if not c.hard
        ]

    def refusal(self, node: int) -> Rejection | None:
        """Why one more worker may not go to `node` now (a DoNotSchedule constraint)."""
        for counts in self.hard:
            skew = counts.skew_after(node)
            c = counts.constraint
            if skew is None:
                return Rejection(
                    "PodTopologySpread", f"outside topology spread on {c.topology_key}"
                )
            if skew > c.max_skew:
                what = f"would break topology spread on {c.topology_key} (maxSkew {c.max_skew})"
                return Rejection("PodTopologySpread", what)
        return None

    def soft_score(self, node: int) -> int:
        """ScheduleAnyway: matching pods in the node's domains, summed; lower is better."""
        total = 0
        for counts in self.soft:
            domain = counts.domain_of[node]
            total += _MISSING if domain is None else counts.counts[domain]
        return total

    def add(self, node: int, workers: int = 1) -> None:
        for counts in (*self.hard, *self.soft):
            counts.add(node, workers)

    def admits(self, allocation: Sequence[tuple[int, int]]) -> bool:
        """Whether the gang's (node, workers) pass the DoNotSchedule checks, each worker
        added in turn to the node whose domain is emptiest (the state is left as is)."""
        if not self.hard:
            return True
        saved = [dict(c.counts) for c in self.hard]
        left = dict(allocation)
        try:
            while left:
                node = min(left, key=lambda n: (self._fill(n), n))
                if self.refusal(node) is not None:
                    return False
                for counts in self.hard:
                    counts.add(node, 1)
                left[node] -= 1
                if not left[node]:
                    del left[node]
            return True
        finally:
            for counts, before in zip(self.hard, saved, strict=True):
                counts.counts = before

    def _fill(self, node: int) -> tuple[int, ...]:
        return tuple(counts.counts.get(counts.domain_of[node] or "", 0) for counts in self.hard)


def _count(
    nodes: Sequence[NodeInfo], needs: PodNeeds, constraint: SpreadConstraint, keys: Sequence[str]
) -> _Counts:
    domain_of: list[str | None] = []
    counts: dict[str, int] = {}
    for node in nodes:
        if not _takes_part(node, needs, constraint, keys):
            domain_of.append(None)
            continue
        domain = node.labels[constraint.topology_key]
        domain_of.append(domain)
        counts[domain] = counts.get(domain, 0) + _matching(node, needs, constraint)
    return _Counts(constraint, domain_of, counts)


def _takes_part(
    node: NodeInfo, needs: PodNeeds, constraint: SpreadConstraint, keys: Sequence[str]
) -> bool:
    if any(key not in node.labels for key in keys):
        return False  # common.go nodeLabelsMatchSpreadConstraints
    if constraint.honor_affinity and filters.affinity_rejection(needs, node) is not None:
        return False
    if constraint.honor_taints:
        for taint in node.taints:
            if taint.effect in _BLOCKING and not _tolerated(needs, taint):
                return False
    return True


def _tolerated(needs: PodNeeds, taint: Taint) -> bool:
    return any(t.tolerates(taint) for t in needs.tolerations)


def _matching(node: NodeInfo, needs: PodNeeds, constraint: SpreadConstraint) -> int:
    """Pods on the node in the pod's namespace that the constraint's selector matches."""
    selector = constraint.selector
    if selector is None:
        return 0
    return sum(
        count
        for (namespace, labels), count in node.labelled.items()
        if namespace == needs.namespace and selector.matches(dict(labels))
    )


def worker_by_worker(
    snapshot: ClusterSnapshot,
    needs: PodNeeds,
    *,
    workers: int,
    span: range,
    slots: Sequence[int],
    preference: Sequence[int],
    free: Sequence[int],
) -> list[tuple[int, int]] | str:
    """(node, workers) for the gang inside the node range `span`, each worker on a node
    that passes the DoNotSchedule checks at its turn, as kube-scheduler would place them
    one by one; the reason, in its terms, when some worker finds none.

    Among the nodes that pass, a worker goes where the gang already is (domains in use
    at each level, highest first: the topology objective), then to the best preferred
    affinity and ScheduleAnyway score (`preference`), then to the fullest node."""
    state = SpreadState(snapshot, needs)
    topology = snapshot.topology
    levels = range(1, topology.node_level + 1)
    left = {i: slots[i] for i in span if slots[i] > 0}
    used: dict[int, set[int]] = {level: set() for level in levels}
    taken: dict[int, int] = {}
    for worker in range(workers):
        best: tuple[tuple[object, ...], int] | None = None
        for node, room in left.items():
            if room == 0 or state.refusal(node) is not None:
                continue
            fresh = tuple(topology.node_domains[level][node] not in used[level] for level in levels)
            key = (fresh, -preference[node], room, free[node], node)
            if best is None or key < best[0]:
                best = (key, node)
        if best is None:
            return _refusal(snapshot, needs, state, left, worker=worker, workers=workers)
        node = best[1]
        left[node] -= 1
        taken[node] = taken.get(node, 0) + 1
        state.add(node)
        for level in levels:
            used[level].add(topology.node_domains[level][node])
    return sorted(taken.items())


def _refusal(
    snapshot: ClusterSnapshot,
    needs: PodNeeds,
    state: SpreadState,
    left: dict[int, int],
    *,
    worker: int,
    workers: int,
) -> str:
    """How many nodes fit the next worker and why the rest do not (filters.describe)."""
    static = snapshot.rejections(needs)
    why: list[tuple[Rejection, ...]] = []
    for node in range(len(snapshot.nodes)):
        if left.get(node, 0) > 0:
            refused = state.refusal(node)
            why.append((refused,) if refused is not None else ())
        elif node in left:
            why.append((Rejection("Gang", "full with the gang's other workers"),))
        else:
            why.append(static[node] or (Rejection("Gang", "outside the domain tried"),))
    placed = explain.plural(worker, "worker")
    subject = f"worker {worker + 1} of {workers}"
    return f"{placed} placed within the topology spread; {filters.describe(len(why), why, subject)}"
