"""The few fields placement keeps of each Node and Pod. Pure.

The operator's watch caches hold these records instead of whole objects, so its
memory grows with what placement needs (a few hundred bytes a pod), not with the
size of the objects in the cluster. `trainwave plan` builds the same records from
a fresh listing. Pods that hold nothing on any node and are not trainwave workers
(a foreign pod waiting for kube-scheduler) have no record.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from types import MappingProxyType
from typing import Any

from trainwave import contract
from trainwave.api.quantity import BadQuantity, parse_quantity
from trainwave.hardware.inventory import InventoryError, NodeInventory, decode
from trainwave.placement.quantities import amounts
from trainwave.placement.requirements import (
    HostPort,
    PodNeeds,
    Taint,
    host_ports,
    pod_needs,
    pod_requests,
    taints_of,
)

_FINISHED = frozenset({"Succeeded", "Failed"})
MIB = 1024**2


@dataclass(frozen=True, slots=True)
class SharedGpu:
    uuid: str
    index: int
    memory_mib: int
    used_mib: int = 0

    @property
    def free_mib(self) -> int:
        return max(0, self.memory_mib - self.used_mib)


@dataclass(frozen=True, slots=True)
class NodeRecord:
    name: str
    labels: Mapping[str, str]
    allocatable: Mapping[str, int]
    taints: tuple[Taint, ...] = ()
    cordoned: bool = False
    ready: bool = True
    # When Ready last left True (its lastTransitionTime): how long a worker there has
    # been cut off, for the failure policy's nodeNotReadySeconds.
    not_ready_since: datetime | None = None
    shared: tuple[SharedGpu, ...] = ()  # offered for sharing (the agent's inventory)
    inventory: NodeInventory | None = None  # the agent's annotation, read
    inventory_problem: str = ""  # why the annotation could not be read
    # trainwave.io/straggler-until: no gang is placed here before then (placement/marks.py).
    straggler_until: datetime | None = None

    @property
    def whole_gpus(self) -> int:
        """GPUs for whole-GPU gangs: the device plugin counts shared ones too; they are
        not free for gangs, which would run next to the shared jobs pinned there."""
        return max(0, self.allocatable.get(contract.GPU_RESOURCE, 0) - len(self.shared))


@dataclass(frozen=True, slots=True)
class WorkerIdentity:
    """Which gang a trainwave worker pod belongs to."""

    job: str  # the job's name (label); the namespace is the pod's
    attempt: int
    rank: int
    priority: int = 0
    preemptible: bool = True
    preempted_at: str = ""  # when an earlier attempt of this job was preempted
    # runPolicy.maxRunSeconds as the pod carries it (0: unbounded), and the epoch second by
    # which it is stopped once released (released-at plus that; None until then).
    max_run_seconds: int = 0
    run_until: float | None = None


@dataclass(frozen=True, slots=True)
class PodRecord:
    namespace: str
    name: str
    uid: str
    node: str  # where it holds resources: spec.nodeName, or the node it was released to
    holds: bool  # counts on `node` now
    bound: bool
    deleting: bool
    requests: tuple[tuple[str, int], ...] = ()
    host_ports: tuple[HostPort, ...] = ()
    gpu_uuid: str = ""  # a shared worker's GPU
    gpu_mib: int = 0
    worker: WorkerIdentity | None = None  # trainwave workers only
    gated: bool = False  # behind trainwave's scheduling gate
    # Gated workers only: what the filters test, and what the release patch starts from.
    needs: PodNeeds | None = None
    release_basis: Mapping[str, Any] | None = None
    # Holding pods that are not terminating: their labels, sorted, for the topology spread
    # constraints of pods placed later (kube-scheduler skips terminating pods there).
    labels: tuple[tuple[str, str], ...] = ()


def node_record(node: Mapping[str, Any]) -> NodeRecord:
    metadata = node.get("metadata") or {}
    spec = node.get("spec") or {}
    status = node.get("status") or {}
    try:
        allocatable = amounts(status.get("allocatable") or status.get("capacity") or {})
    except BadQuantity:
        allocatable = {}  # the kubelet wrote it; an unreadable one offers nothing
    inventory, problem = read_inventory(node)
    return NodeRecord(
        name=sys.intern(str(metadata["name"])),
        labels=MappingProxyType(_interned(metadata.get("labels"))),
        allocatable=MappingProxyType(allocatable),
        taints=taints_of(spec.get("taints")),
        cordoned=bool(spec.get("unschedulable")),
        ready=_ready(status),
        not_ready_since=_not_ready_since(status),
        shared=_shared_gpus(inventory),
        inventory=inventory,
        inventory_problem=problem,
        straggler_until=_time(
            (metadata.get("annotations") or {}).get(contract.ANNOTATION_STRAGGLER_UNTIL)
        ),
    )


def _interned(labels: Mapping[str, Any] | None) -> dict[str, str]:
    """Labels with each key and value interned: every node and worker repeats the same
    keys and most values (a rack's name on its 16 nodes, a job's on its workers), and
    each watch event decodes fresh copies of them. One copy each is kept."""
    return {sys.intern(str(k)): sys.intern(str(v)) for k, v in (labels or {}).items()}


def _ready(status: Mapping[str, Any]) -> bool:
    for condition in status.get("conditions") or ():
        if condition.get("type") == "Ready":
            return bool(condition.get("status") == "True")
    return True  # no conditions yet: a node just registered, not a node known to be down


def _not_ready_since(status: Mapping[str, Any]) -> datetime | None:
    for condition in status.get("conditions") or ():
        if condition.get("type") == "Ready" and condition.get("status") != "True":
            stamp = condition.get("lastTransitionTime")
            try:
                return datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))
            except ValueError:
                return None  # no time known: the caller counts from when it first looked
    return None


def pod_record(pod: Mapping[str, Any]) -> PodRecord | None:
    """What placement keeps of a pod; None for a pod that holds nothing and is not ours."""
    metadata = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    annotations = metadata.get("annotations") or {}
    labels = metadata.get("labels") or {}
    finished = (pod.get("status") or {}).get("phase") in _FINISHED
    deleting = bool(metadata.get("deletionTimestamp"))
    bound_to = sys.intern(str(spec.get("nodeName") or ""))
    gated = is_gated(spec)
    released_to = sys.intern(str(annotations.get(contract.ANNOTATION_PLACED_NODE) or ""))
    if bound_to:
        node, holds = bound_to, not finished
    else:
        # Released, pinned, not bound yet: a reservation, until it binds or goes.
        node = released_to
        holds = bool(released_to) and not gated and not deleting and not finished
    worker = _worker(labels, annotations, spec)
    if not holds and worker is None:
        return None
    try:
        requests = tuple(sorted(pod_requests(spec).items()))
        needs = pod_needs(pod) if gated and worker is not None else None
    except BadQuantity:
        requests, needs = (), None
    uuid = str(annotations.get(contract.ANNOTATION_GPU_UUID) or "")
    return PodRecord(
        # Interned: the job cache's WorkerPod of the same pod shares them (observed.py).
        namespace=sys.intern(str(metadata.get("namespace") or "")),
        name=sys.intern(str(metadata.get("name") or "")),
        uid=sys.intern(str(metadata.get("uid") or "")),
        node=node,
        holds=holds,
        bound=bool(bound_to),
        deleting=deleting,
        requests=requests,
        host_ports=host_ports(spec),
        gpu_uuid=uuid,
        gpu_mib=dict(requests).get(contract.SHARED_GPU_MEMORY_RESOURCE, 0) if uuid else 0,
        worker=worker,
        gated=gated,
        needs=needs,
        release_basis=_release_basis(metadata, spec) if needs is not None else None,
        labels=tuple(sorted(_interned(labels).items())) if holds and not deleting else (),
    )


@dataclass(frozen=True, slots=True)
class ClaimRecord:
    """GPU memory a ResourceClaim that is not a trainwave worker's holds on shared GPUs
    (driver gpu.trainwave.io): (node, GPU index, MiB) per allocated device. A worker's own
    claim is counted through its pod (`PodRecord.gpu_uuid`), never twice."""

    shares: tuple[tuple[str, int, int], ...]


# A device allocated whole (no shareID) leaves nothing to share: counted as more than any GPU.
WHOLE_DEVICE_MIB = 1 << 40


def claim_record(claim: Mapping[str, Any]) -> ClaimRecord | None:
    """What placement keeps of a ResourceClaim; None when it holds no shared GPU of ours."""
    labels = (claim.get("metadata") or {}).get("labels") or {}
    if labels.get(contract.LABEL_ROLE) == contract.ROLE_WORKER:
        return None  # a worker's claim (builders/sharing.py): its pod is counted
    allocation = (claim.get("status") or {}).get("allocation") or {}
    shares = []
    for result in (allocation.get("devices") or {}).get("results") or ():
        device = str(result.get("device") or "")
        index = device.removeprefix(contract.DRA_DEVICE_PREFIX)
        if result.get("driver") != contract.DRA_DRIVER or not index.isdigit():
            continue
        consumed = (result.get("consumedCapacity") or {}).get(contract.DRA_CAPACITY_MEMORY)
        try:
            mib = -(-int(parse_quantity(consumed)) // MIB) if consumed else WHOLE_DEVICE_MIB
        except BadQuantity:
            mib = WHOLE_DEVICE_MIB  # unreadable: assume the worst rather than over-commit
        shares.append((str(result.get("pool") or ""), int(index), mib))
    return ClaimRecord(tuple(shares)) if shares else None


def is_gated(spec: Mapping[str, Any]) -> bool:
    return any(g.get("name") == contract.SCHEDULING_GATE for g in spec.get("schedulingGates") or ())


def _worker(
    labels: Mapping[str, str], annotations: Mapping[str, str], spec: Mapping[str, Any]
) -> WorkerIdentity | None:
    job = labels.get(contract.LABEL_JOB_NAME)
    if not job or labels.get(contract.LABEL_ROLE) != contract.ROLE_WORKER:
        return None
    try:
        attempt = int(labels.get(contract.LABEL_ATTEMPT, ""))
        rank = int(labels.get(contract.LABEL_RANK, ""))
    except ValueError:
        return None
    priority = _int(annotations.get(contract.ANNOTATION_PRIORITY), _int(spec.get("priority"), 0))
    preemptible = annotations.get(contract.ANNOTATION_PREEMPTIBLE, "true") != "false" and (
        spec.get("preemptionPolicy") != "Never"
    )
    max_run = max(0, _int(annotations.get(contract.ANNOTATION_MAX_RUN_SECONDS), 0))
    # Parsed only for bounded pods: this runs on every pod event of the cluster.
    released = _time(annotations.get(contract.ANNOTATION_RELEASED_AT)) if max_run else None
    return WorkerIdentity(
        job=sys.intern(job),
        attempt=attempt,
        rank=rank,
        priority=priority,
        preemptible=preemptible,
        preempted_at=str(annotations.get(contract.ANNOTATION_PREEMPTED_AT) or ""),
        max_run_seconds=max_run,
        run_until=released.timestamp() + max_run if max_run and released else None,
    )


def _int(value: object, default: int) -> int:
    try:
        return int(str(value))
    except ValueError:
        return default


def _release_basis(metadata: Mapping[str, Any], spec: Mapping[str, Any]) -> Mapping[str, Any]:
    """The parts of a gated pod the release patch is computed from (builders/gating.py)."""
    return {
        "metadata": {
            "name": metadata.get("name"),
            "namespace": metadata.get("namespace"),
            "uid": metadata.get("uid"),
            "resourceVersion": metadata.get("resourceVersion"),
        },
        "spec": {
            "schedulingGates": list(spec.get("schedulingGates") or ()),
            "affinity": spec.get("affinity") or {},
            # A shared worker's GPU claim, created at release (builders/sharing.py).
            "resourceClaims": [
                claim
                for claim in spec.get("resourceClaims") or ()
                if claim.get("name") == contract.DRA_POD_CLAIM
            ],
        },
    }


def read_inventory(node: Mapping[str, Any]) -> tuple[NodeInventory | None, str]:
    """The node agent's inventory annotation, read, or why it cannot be (naming the field).

    An unreadable one offers nothing (no shared GPUs, no NIC choice) until the
    agent rewrites it on its next pass.
    """
    annotations = (node.get("metadata") or {}).get("annotations") or {}
    text = annotations.get(contract.ANNOTATION_INVENTORY)
    if not text:
        return None, ""
    try:
        return decode(str(text)), ""
    except InventoryError as error:
        return None, f"annotation {contract.ANNOTATION_INVENTORY}: {error}"


def _shared_gpus(inventory: NodeInventory | None) -> tuple[SharedGpu, ...]:
    if inventory is None:
        return ()
    return tuple(SharedGpu(gpu.uuid, gpu.index, gpu.memory_mib) for gpu in inventory.shared_gpus)


def _time(value: Any) -> datetime | None:
    """An RFC 3339 time with a zone, or None: an annotation anyone may have written."""
    if not isinstance(value, str):
        return None
    try:
        found = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return found if found.tzinfo is not None else None
