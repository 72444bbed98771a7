"""The placer's release side: an admitted gang's patches, and applying them in the background.

A release pins each worker to its node (and, shared, to its GPU), annotates it and lifts
its scheduling gate, in one patch per pod built from the pod as the cache last saw it
(its resourceVersion: a pod that changed meanwhile refuses the patch). The Releaser
reserves the gang's room at once (controller/inflight.py) and applies the patches in
a task of its own, so the next round does not wait for them; a refused patch or GPU
claim gives that room back and wakes the job's reconcile.

Workers with a DRA claim on a shared GPU are released one at a time per GPU: the next
once the cache shows the one before bound (or gone), or after BIND_WAIT_SECONDS.
kube-scheduler v1.34.4 counts a claim's consumed capacity twice for a moment while it
binds the claim's pod (pkg/scheduler/framework/plugins/dynamicresources/dra_manager.go,
GatherAllocatedState: the claim is already among the assume cache's allocated devices
and still among the in-flight allocations until PreBind ends). A claim for the same GPU
scheduled in that moment is refused as over-committing it, and the plugin's queueing
hint asks again only when that claim or a slice changes or a claim is deallocated
(isSchedulableAfterClaimChange): on the real node, 44 s, until the first job ended. A
pod is bound only after PreBind, so a worker released after its GPU's previous one is
bound never meets that moment.
"""

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from trainwave import contract
from trainwave.api.network import NetworkSpec
from trainwave.api.trainingjob import JobKey
from trainwave.builders.gating import build_release_patch
from trainwave.builders.network import gang_link_env, node_network_env
from trainwave.builders.sharing import build_gpu_claim
from trainwave.controller import metrics
from trainwave.controller.api_errors import Conflict, Rejected
from trainwave.controller.inflight import Inflight
from trainwave.controller.kube import KubeClient
from trainwave.hardware.inventory import NodeInventory
from trainwave.placement.gang_types import Placement
from trainwave.placement.records import PodRecord
from trainwave.placement.sharing import SharedPlacement

logger = logging.getLogger(__name__)

# How long a shared GPU's next worker waits for the one before to be bound. A pod that
# kube-scheduler refuses for another reason holds its GPU's turn no longer than this.
BIND_WAIT_SECONDS = 10.0
BIND_POLL_SECONDS = 0.05


@dataclass(frozen=True)
class Release:
    """One admitted gang's release: each pod's patch and where it will hold room."""

    key: JobKey
    patches: list[tuple[Mapping[str, Any], dict[str, Any]]]
    summary: str
    targets: list[tuple[PodRecord, str, str, int]]  # (pod, node, GPU UUID, GPU MiB)
    # Shared workers' DRA ResourceClaims, created before the pods are released.
    claims: list[dict[str, Any]] = field(default_factory=list)
    # The pods with one: released in their GPU's turn (the module's docstring).
    in_turn: frozenset[str] = frozenset()


def build_shared_release(key: JobKey, gang: list[PodRecord], placed: SharedPlacement) -> Release:
    """Each shared worker pinned to its node and GPU (CUDA_VISIBLE_DEVICES), with its claim."""
    now, summary = _now(), placed.describe()
    patches = []
    for pod, pin in zip(gang, placed.pins, strict=True):
        notes = {
            contract.ANNOTATION_RELEASED_AT: now,
            contract.ANNOTATION_PLACEMENT_SUMMARY: summary,
            contract.ANNOTATION_GPU_UUID: pin.gpu_uuid,
        }
        env = {"CUDA_VISIBLE_DEVICES": pin.gpu_uuid}
        patches.append((_basis(pod), build_release_patch(_basis(pod), pin.node, notes, env)))
    targets = [
        (pod, pin.node, pin.gpu_uuid, pin.memory_mib)
        for pod, pin in zip(gang, placed.pins, strict=True)
    ]
    claimed = {
        pod.name: claim
        for pod, pin in zip(gang, placed.pins, strict=True)
        if (claim := build_gpu_claim(_basis(pod), pin.gpu_uuid, pin.memory_mib)) is not None
    }
    return Release(key, patches, summary, targets, list(claimed.values()), frozenset(claimed))


def build_whole_release(
    key: JobKey,
    gang: list[PodRecord],
    placement: Placement,
    inventories: Mapping[str, NodeInventory],
    network: NetworkSpec | None,
) -> Release:
    """Each whole-GPU worker pinned to its node, with the NCCL settings of the chosen nodes."""
    summary = placement.describe()
    notes = {
        contract.ANNOTATION_RELEASED_AT: _now(),
        contract.ANNOTATION_PLACEMENT_SUMMARY: summary,
    }
    nodes = placement.nodes
    chosen = [inventories[n] for n in dict.fromkeys(nodes) if n in inventories]
    link = gang_link_env(network, chosen) if len(chosen) == len(set(nodes)) else {}
    patches = []
    for pod, node in zip(gang, nodes, strict=True):
        env = {**node_network_env(network, inventories.get(node)), **link}
        patches.append((_basis(pod), build_release_patch(_basis(pod), node, notes, env)))
    targets = [(pod, node, "", 0) for pod, node in zip(gang, nodes, strict=True)]
    return Release(key, patches, summary, targets)


class Releaser:
    """Applies releases in the background; `placed` is told of each gang fully released.

    `settled(namespace, name)`: whether the cache shows that pod bound to its node, or no
    longer there; what a shared GPU's next worker waits for (the module's docstring).
    """

    def __init__(
        self,
        kube: KubeClient,
        inflight: Inflight,
        wake: Callable[[JobKey], None],
        placed: Callable[[JobKey], None],
        settled: Callable[[str, str], bool] = lambda _namespace, _name: True,
    ):
        self._kube = kube
        self._inflight = inflight
        self._wake = wake
        self._placed = placed
        self._settled = settled
        self._releasing: set[asyncio.Task[None]] = set()
        self._turns: dict[str, _Turn] = {}  # shared GPU UUID -> its releases, in order

    def dispatch(self, release: Release) -> None:
        """Reserve the gang's room, then patch its pods in the background, as kube-scheduler
        assumes a pod in its cache and binds it asynchronously (pkg/scheduler/schedule_one.go:
        assume, then the binding cycle in a goroutine; ForgetPod when binding fails). The
        next round starts without waiting for the patches and counts the reserved room."""
        for pod, node, uuid, mib in release.targets:
            self._inflight.add(pod, node, uuid, mib)
        task = asyncio.create_task(self._apply_release(release))
        self._releasing.add(task)
        task.add_done_callback(self._released)

    async def drain(self) -> None:
        """Wait until every gang handed to the background has been patched."""
        while self._releasing:
            await asyncio.wait(set(self._releasing))

    def _released(self, task: asyncio.Task[None]) -> None:
        self._releasing.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("releasing a gang failed: %s", task.exception())

    async def _apply_release(self, release: Release) -> None:
        key, patches, summary, targets = (
            release.key, release.patches, release.summary, release.targets
        )  # fmt: skip
        if not await self._create_claims(release):
            return
        results = await asyncio.gather(
            *(
                self._patch_in_turn(basis, patch, uuid)
                if pod.name in release.in_turn
                else self._patch(basis, patch)
                for (basis, patch), (pod, _, uuid, _) in zip(patches, targets, strict=True)
            ),
            return_exceptions=True,
        )
        for result, (pod, *_) in zip(results, targets, strict=True):
            if isinstance(result, BaseException):
                self._inflight.forget(pod)  # refused: it holds nothing
        failed = [r for r in results if isinstance(r, BaseException)]
        for error in failed:
            if not isinstance(error, Conflict | Rejected):
                raise error
            logger.warning("%s/%s: releasing a worker failed: %s", *key, error)
        if failed:
            self._wake(key)  # its reconcile says so; the rest are placed again next round
            return
        self._placed(key)
        logger.info("%s/%s: placed: %s", *key, summary)
        metrics.GANGS_PLACED.inc()
        # No wake: each patched pod's watch event wakes the job (batched), and a reconcile
        # woken now would find the pods released but not bound and write a status
        # that is stale a moment later.

    async def _patch(self, pod: Mapping[str, Any], patch: dict[str, Any]) -> None:
        meta = pod["metadata"]
        await asyncio.to_thread(self._kube.patch_pod, meta["namespace"], meta["name"], patch)

    async def _patch_in_turn(
        self, pod: Mapping[str, Any], patch: dict[str, Any], uuid: str
    ) -> None:
        """Release a worker with a claim on shared GPU `uuid` once the GPU's previous one
        is bound, and hold the GPU's turn until this one is (the module's docstring)."""
        turn = self._turns.setdefault(uuid, _Turn())
        turn.users += 1
        try:
            async with turn.lock:
                await self._patch(pod, patch)
                await self._until_settled(pod["metadata"]["namespace"], pod["metadata"]["name"])
        finally:
            turn.users -= 1
            if not turn.users:
                del self._turns[uuid]

    async def _until_settled(self, namespace: str, name: str) -> None:
        deadline = time.monotonic() + BIND_WAIT_SECONDS
        while not self._settled(namespace, name):
            if time.monotonic() >= deadline:
                logger.info(
                    "%s/%s: not bound %.0fs after its release; its GPU's next worker goes now",
                    namespace, name, BIND_WAIT_SECONDS,
                )  # fmt: skip
                return
            await asyncio.sleep(BIND_POLL_SECONDS)

    async def _create_claims(self, release: Release) -> bool:
        """The gang's GPU claims, all before any pod is released: a worker whose claim is
        missing would wait unbound beside a running gang. False (nothing released, the
        room given back, the gang placed again next round) when one was refused."""
        if not release.claims:
            return True
        results = await asyncio.gather(
            *(asyncio.to_thread(self._kube.create_gpu_claim, claim) for claim in release.claims),
            return_exceptions=True,
        )
        failed = [r for r in results if isinstance(r, BaseException)]
        if not failed:
            return True
        for pod, *_ in release.targets:
            self._inflight.forget(pod)
        for error in failed:
            if not isinstance(error, Conflict | Rejected):
                raise error
            logger.warning("%s/%s: creating a GPU claim failed: %s", *release.key, error)
        self._wake(release.key)
        return False


@dataclass
class _Turn:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0


def _basis(pod: PodRecord) -> Mapping[str, Any]:
    assert pod.release_basis is not None
    return pod.release_basis


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
