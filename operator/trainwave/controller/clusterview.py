"""What placement reads of the cluster, kept up to date one change at a time.

`ClusterIndex` holds node and pod records (placement/records.py) and, next to
them, what the pods use on each node, updated per change: a pod's old record is
taken away and its new one added, so a view costs O(nodes), not O(pods), however
many pods the cluster runs. It is the one aggregation: the operator's watch cache
(cluster_cache.py) feeds it events, `trainwave plan` (`listed_view`) one fresh
listing. The sums mirror `snapshot.usage_of` exactly; a unit test holds them to it.

Not thread-safe; ClusterCache takes its lock around every call.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections import Counter, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from operator import attrgetter
from types import MappingProxyType

from kubernetes.client.exceptions import ApiException

from trainwave.api.trainingjob import JobKey
from trainwave.controller.kube import ACTIVE_PODS, KubeClient
from trainwave.hardware.inventory import NodeInventory
from trainwave.kube.informer import list_records
from trainwave.placement.node_memo import NodeInfoMemo, snapshot_of
from trainwave.placement.records import (
    ClaimRecord,
    NodeRecord,
    PodRecord,
    claim_record,
    node_record,
    pod_record,
)
from trainwave.placement.requirements import HostPort
from trainwave.placement.shared_tasks import SharedShape, pinned_shape
from trainwave.placement.snapshot import ClusterSnapshot, Labelled, NodeUsage
from trainwave.placement.topology import DEFAULT_LEVELS, Topology


@dataclass(frozen=True)
class ClusterView:
    """One consistent moment of the cache, for one placement round."""

    nodes: tuple[NodeRecord, ...]  # by name
    usage: Mapping[str, NodeUsage]  # node -> what its holding pods use
    gated: Mapping[JobKey, tuple[PodRecord, ...]]  # gated worker pods per job, any attempt
    workers: Mapping[JobKey, tuple[PodRecord, ...]]  # worker pods holding resources, per job
    labels_version: int  # changes when node names or labels do: the topology tree is stale
    shared_shapes: tuple[SharedShape, ...]  # each holding pod pinned to a shared GPU, sorted
    # This view's place in its index's ChangeLog: which nodes changed since another view.
    version: int = 0
    changes: ChangeLog | None = field(default=None, compare=False, repr=False)

    def snapshot(
        self,
        levels: tuple[str, ...] = DEFAULT_LEVELS,
        topology: Topology | None = None,
        memo: NodeInfoMemo | None = None,
    ) -> ClusterSnapshot:
        """`topology` may be reused while `labels_version` is the one it was built at;
        `memo` keeps the NodeInfos of nodes unchanged since the caller's last snapshot,
        and with `topology` patches only the nodes the change log names."""
        changed = None
        if memo is not None and topology is not None and self.changes is not None:
            changed = self.changes.since(memo.seen, self.version)
        snapshot = snapshot_of(
            self.nodes, self.usage, levels=levels, topology=topology, memo=memo, changed=changed
        )
        if memo is not None:
            memo.seen = self.version
        return snapshot

    def inventories(self, names: Iterable[str]) -> dict[str, NodeInventory]:
        """The inventories of the named nodes that have one, looked up in the name-sorted
        `nodes`: a placement names a few nodes of thousands, and gathering every node's
        inventory for each was a sixteenth of a round on 4,096 nodes."""
        found: dict[str, NodeInventory] = {}
        for name in names:
            at = bisect_left(self.nodes, name, key=attrgetter("name"))
            if at < len(self.nodes) and self.nodes[at].name == name:
                inventory = self.nodes[at].inventory
                if inventory is not None:
                    found[name] = inventory
        return found


@dataclass
class _Tally:
    """What the holding pods on one node use. Counts travel with the sums so a
    contribution can be taken back exactly (a port two pods declare, a 0 MiB pin)."""

    pods: int = 0
    requests: Counter[str] = field(default_factory=Counter)
    ports: Counter[HostPort] = field(default_factory=Counter)
    mib: Counter[str] = field(default_factory=Counter)  # shared GPU UUID -> MiB pinned
    pinned: Counter[str] = field(default_factory=Counter)  # shared GPU UUID -> pods pinned
    labelled: Counter[Labelled] = field(default_factory=Counter)  # for topology spread

    def add(self, pod: PodRecord, sign: int) -> None:
        self.pods += sign
        for resource, amount in pod.requests:
            self.requests[resource] += sign * amount
        for port in pod.host_ports:
            self.ports[port] += sign
        if pod.gpu_uuid:
            self.mib[pod.gpu_uuid] += sign * pod.gpu_mib
            self.pinned[pod.gpu_uuid] += sign
        if pod.labels:
            self.labelled[(pod.namespace, pod.labels)] += sign

    def usage(self) -> NodeUsage:
        return NodeUsage(
            MappingProxyType({k: v for k, v in self.requests.items() if v}),
            self.pods,
            tuple(sorted(p for p, n in self.ports.items() if n > 0)),
            MappingProxyType({u: self.mib[u] for u, n in self.pinned.items() if n > 0}),
            MappingProxyType({k: n for k, n in self.labelled.items() if n > 0}),
        )


class ChangeLog:
    """Per view version, the nodes whose record or usage changed since the version before
    (None: nodes came or went, or changed labels), so a snapshot can rebuild only those
    (placement/node_memo.py). Written under the index's lock, read by the placer's
    thread: it has a lock of its own. Bounded; a reader further behind makes a full pass."""

    def __init__(self, size: int = 256):
        self._lock = threading.Lock()
        self._entries: deque[tuple[int, frozenset[str] | None]] = deque(maxlen=size)

    def add(self, version: int, names: frozenset[str] | None) -> None:
        with self._lock:
            self._entries.append((version, names))

    def since(self, after: int, upto: int) -> frozenset[str] | None:
        """The nodes changed after version `after` up to `upto`; None when not known."""
        if after == upto:
            return frozenset()
        if after < 0 or after > upto:
            return None
        with self._lock:
            entries = [names for version, names in self._entries if after < version <= upto]
        if len(entries) != upto - after or any(names is None for names in entries):
            return None
        return frozenset().union(*entries)  # type: ignore[arg-type]


class ClusterIndex:
    """Node and pod records by key, with per-node usage and per-job worker indexes."""

    def __init__(self) -> None:
        self._nodes: dict[str, NodeRecord] = {}
        self._pods: dict[str, PodRecord] = {}
        self._tallies: dict[str, _Tally] = {}
        self._usage: dict[str, NodeUsage] = {}
        self._dirty: set[str] = set()  # nodes whose NodeUsage must be rebuilt
        self._gated: dict[JobKey, dict[str, PodRecord]] = {}
        self._workers: dict[JobKey, dict[str, PodRecord]] = {}
        # Each job's pods as the views hand them out, rebuilt only for jobs that changed,
        # so a consumer may keep what it derived from a job's tuple while it is the same.
        self._gated_tuples: dict[JobKey, tuple[PodRecord, ...]] = {}
        self._worker_tuples: dict[JobKey, tuple[PodRecord, ...]] = {}
        self._shapes: Counter[SharedShape] = Counter()
        self._node_tuple: tuple[NodeRecord, ...] | None = None
        self._view: ClusterView | None = None
        self.labels_version = 0
        # Nodes that appeared, vanished or changed readiness since the last drain:
        # the jobs with workers there must look again (failure policy).
        self._health_changed: set[str] = set()
        # Foreign ResourceClaims on shared GPUs: per node, GPU index -> MiB held.
        self._claims: dict[str, ClaimRecord] = {}
        self._claimed: dict[str, Counter[int]] = {}
        # Nodes whose record changed since the last view (None: nodes came, went or were
        # relabelled), for the change log the views carry.
        self._touched: set[str] | None = set()
        self._version = 0
        self._changes = ChangeLog()

    def __len__(self) -> int:
        return len(self._nodes) + len(self._pods)

    @property
    def counts(self) -> dict[str, int]:
        return {
            "nodes": len(self._nodes),
            "pods": len(self._pods),
            "resourceclaims": len(self._claims),
        }

    # --- nodes -------------------------------------------------------------------------

    def node(self, name: str) -> NodeRecord | None:
        return self._nodes.get(name)

    def drain_health_changes(self) -> set[str]:
        changed, self._health_changed = self._health_changed, set()
        return changed

    def _note_health(self, key: str, old: NodeRecord | None, new: NodeRecord | None) -> None:
        if (old is None) != (new is None) or (old and new and old.ready != new.ready):
            self._health_changed.add(key)

    def put_node(self, key: str, record: NodeRecord | None) -> None:
        old = self._nodes.pop(key, None) if record is None else self._nodes.get(key)
        if old is None and record is None:
            return
        if old is not None and record == old:
            return  # a heartbeat: nothing placement reads changed
        if record is not None:
            self._nodes[key] = record
        self._note_health(key, old, record)
        if key in self._claimed:
            self._dirty.add(key)  # its claims name GPUs by index: the UUIDs may have changed
        if old is None or record is None or old.labels != record.labels:
            self.labels_version += 1
            self._touched = None
        elif self._touched is not None:
            self._touched.add(key)
        self._node_tuple = self._view = None

    def replace_nodes(self, records: Mapping[str, NodeRecord]) -> None:
        old = self._nodes
        self._nodes = dict(records)
        for key in old.keys() | records.keys():
            self._note_health(key, old.get(key), records.get(key))
        self._dirty.update(self._claimed.keys())
        if old.keys() != records.keys() or any(
            old[k].labels != r.labels for k, r in records.items()
        ):
            self.labels_version += 1
        self._touched = None
        self._node_tuple = self._view = None

    # --- pods --------------------------------------------------------------------------

    def pod(self, key: str) -> PodRecord | None:
        """An active pod's record by "namespace/name"; None once it ended or is gone."""
        return self._pods.get(key)

    def put_pod(self, key: str, record: PodRecord | None) -> None:
        if record is not None and self._pods.get(key) == record:
            return  # a status write placement does not read (kwok's, the kubelet's)
        old = self._pods.pop(key, None)
        if old is None and record is None:
            return
        if old is not None:
            self._count(key, old, -1)
        if record is not None:
            self._pods[key] = record
            self._count(key, record, +1)
        self._view = None

    def replace_pods(self, records: Mapping[str, PodRecord]) -> None:
        """Everything from a fresh LIST; pods the store had and the list lacks are gone."""
        for key in list(self._pods):
            if key not in records:
                self.put_pod(key, None)
        for key, record in records.items():
            if self._pods.get(key) != record:
                self.put_pod(key, record)

    def _count(self, key: str, pod: PodRecord, sign: int) -> None:
        if pod.holds:
            tally = self._tallies.setdefault(pod.node, _Tally())
            tally.add(pod, sign)
            if tally.pods == 0:
                del self._tallies[pod.node]
            self._dirty.add(pod.node)
            if pod.gpu_uuid:
                self._shapes[pinned_shape(pod.gpu_mib, pod.requests)] += sign
        if pod.worker is None:
            return
        job = (pod.namespace, pod.worker.job)
        if pod.gated:
            _index(self._gated, job, key, pod, sign)
            self._gated_tuples.pop(job, None)
        if pod.holds:
            _index(self._workers, job, key, pod, sign)
            self._worker_tuples.pop(job, None)

    # --- claims ------------------------------------------------------------------------

    def put_claim(self, key: str, record: ClaimRecord | None) -> None:
        old = self._claims.pop(key, None)
        if old is None and record is None:
            return
        if old is not None:
            self._count_claim(old, -1)
        if record is not None:
            self._claims[key] = record
            self._count_claim(record, +1)
        self._view = None

    def replace_claims(self, records: Mapping[str, ClaimRecord]) -> None:
        for key in list(self._claims):
            if key not in records:
                self.put_claim(key, None)
        for key, record in records.items():
            if self._claims.get(key) != record:
                self.put_claim(key, record)

    def _count_claim(self, claim: ClaimRecord, sign: int) -> None:
        for node, index, mib in claim.shares:
            held = self._claimed.setdefault(node, Counter())
            held[index] += sign * mib
            if not any(held.values()):
                del self._claimed[node]
            self._dirty.add(node)

    def _node_usage(self, node: str) -> NodeUsage | None:
        tally = self._tallies.get(node)
        usage = tally.usage() if tally is not None else None
        claimed = self._claimed.get(node)
        record = self._nodes.get(node)
        if not claimed or record is None:
            return usage
        # The claims name GPUs by index (device gpu-<i>); the packer counts by UUID.
        uuids = {gpu.index: gpu.uuid for gpu in record.shared}
        mib = Counter(usage.gpu_mib if usage is not None else {})
        for index, held in claimed.items():
            if index in uuids and held > 0:
                mib[uuids[index]] += held
        base = usage if usage is not None else NodeUsage()
        return replace(base, gpu_mib=MappingProxyType(dict(mib)))

    # --- reading -----------------------------------------------------------------------

    def view(self) -> ClusterView:
        """A frozen view; the same object until something changes."""
        if self._view is not None:
            return self._view
        touched = None if self._touched is None else self._touched | self._dirty
        self._touched = set()
        self._version += 1
        self._changes.add(self._version, None if touched is None else frozenset(touched))
        for node in self._dirty:
            usage = self._node_usage(node)
            if usage is None:
                self._usage.pop(node, None)
            else:
                self._usage[node] = usage
        self._dirty.clear()
        if self._node_tuple is None:
            self._node_tuple = tuple(self._nodes[k] for k in sorted(self._nodes))
        self._view = ClusterView(
            nodes=self._node_tuple,
            usage=MappingProxyType(dict(self._usage)),
            gated=_frozen(self._gated, self._gated_tuples),
            workers=_frozen(self._workers, self._worker_tuples),
            labels_version=self.labels_version,
            shared_shapes=tuple(sorted(self._shapes.elements())),
            version=self._version,
            changes=self._changes,
        )
        return self._view


def _index(
    index: dict[JobKey, dict[str, PodRecord]], job: JobKey, key: str, pod: PodRecord, sign: int
) -> None:
    if sign > 0:
        index.setdefault(job, {})[key] = pod
        return
    pods = index.get(job, {})
    pods.pop(key, None)
    if not pods:
        index.pop(job, None)


def _frozen(
    index: Mapping[JobKey, Mapping[str, PodRecord]],
    tuples: dict[JobKey, tuple[PodRecord, ...]],
) -> Mapping[JobKey, tuple[PodRecord, ...]]:
    """Per job its pods by key; `tuples` keeps each job's tuple until that job changes."""
    for job in tuples.keys() - index.keys():
        del tuples[job]
    for job, pods in index.items():
        if job not in tuples:
            tuples[job] = tuple(pods[k] for k in sorted(pods))
    return MappingProxyType(dict(tuples))


def listed_view(kube: KubeClient) -> ClusterView:
    """The same view from one fresh paginated LIST: for `trainwave plan`, which has no cache."""
    index = ClusterIndex()
    nodes, _ = list_records(kube.core.list_node, node_record)
    index.replace_nodes(nodes)
    pods, _ = list_records(
        partial(kube.core.list_pod_for_all_namespaces, field_selector=ACTIVE_PODS), pod_record
    )
    index.replace_pods(pods)
    try:
        claims, _ = list_records(kube.resource.list_resource_claim_for_all_namespaces, claim_record)
    except ApiException as error:
        if error.status not in (403, 404):
            raise
        claims = {}  # no resource.k8s.io, or claims not readable: nothing to count
    index.replace_claims(claims)
    return index.view()
