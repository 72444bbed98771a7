"""The placer: one serialized loop that starts gangs whole, where the engine says.

Reconciles run concurrently; placement must not: two gangs decided at once
against the same snapshot could both count on the same free GPUs. So a
reconcile only hands its gang over (a Ticket) once every worker exists behind
the scheduling gate, and reads back the latest reason it waits.

One round:
1. List nodes and active pods, fresh, in all namespaces (other workloads use
   GPUs too). Pods released but not yet bound count on the node they were
   pinned to (annotation): the reservation lives in the API, so it survives an
   operator restart and every trainwave replica or instance sees it.
2. schedule() every ticketed gang whose gated pods are all there: priority,
   FIFO, bounded backfill, all or nothing (placement/queueing.py).
3. Release each admitted gang: pin every pod to its node and lift its gate.
   A pod that changed meanwhile refuses the patch (resourceVersion); its
   gang's released pods keep their reservation and the rest are placed again
   next round.
4. Remember why each other gang waits; wake its reconcile when that changed,
   so the Scheduled condition tells the user.
Rounds run when a ticket arrives, when a worker pod changes (room may have
been freed) and every few seconds while anything waits (foreign pods, nodes).
"""

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from trainwave import contract
from trainwave.api.network import NetworkSpec
from trainwave.builders.gating import build_release_patch, is_gated
from trainwave.builders.network import gang_link_env, node_network_env, rdma_shortfall
from trainwave.controller import metrics
from trainwave.controller.kube import Conflict, KubeClient, Rejected
from trainwave.lifecycle.draft import PlacementWait
from trainwave.lifecycle.placing import RDMA_UNAVAILABLE
from trainwave.placement.gang import GangRequest, Placement
from trainwave.placement.queueing import PendingJob, QueuePolicy, schedule
from trainwave.placement.sharing import (
    Pin,
    SharedRefusal,
    build_shared_nodes,
    place_shared,
    requested_mib,
    with_pins,
)
from trainwave.placement.snapshot import build_snapshot, pod_gpus, read_inventory

logger = logging.getLogger(__name__)

JobKey = tuple[str, str]
Pod = dict[str, Any]


@dataclass(frozen=True)
class Ticket:
    """A gang waiting for a place: its attempt and what it needs."""

    attempt: int
    request: GangRequest
    priority: int = 0
    arrival: float = 0.0
    network: NetworkSpec | None = None  # for the NCCL settings of each chosen node
    shared_mib: int | None = None  # GPU memory per worker on a shared GPU (gpuSharing)
    shared_how: str = ""  # where that number came from, for the messages


class Placer:
    def __init__(
        self,
        kube: KubeClient,
        levels: Sequence[str],
        wake: Callable[[JobKey], None],
        *,
        policy: QueuePolicy | None = None,
        retry_seconds: float = 5.0,
        debounce_seconds: float = 0.05,
    ):
        self._kube = kube
        self._levels = tuple(levels)
        self._wake = wake
        self._policy = policy or QueuePolicy()
        self._retry = retry_seconds
        self._debounce = debounce_seconds
        self._tickets: dict[JobKey, Ticket] = {}
        self._skips: dict[JobKey, int] = {}
        self._waits: dict[JobKey, PlacementWait] = {}
        self._event = asyncio.Event()

    def submit(self, key: JobKey, ticket: Ticket) -> None:
        if self._tickets.get(key) != ticket:
            self._tickets[key] = ticket
            self._event.set()

    def withdraw(self, key: JobKey) -> None:
        self._tickets.pop(key, None)
        self._skips.pop(key, None)
        self._waits.pop(key, None)

    def waiting(self, key: JobKey) -> PlacementWait | None:
        return self._waits.get(key)

    def poke(self) -> None:
        """Room may have been freed: try the waiting gangs again soon."""
        if self._tickets:
            self._event.set()

    async def run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._event.wait(), timeout=self._retry)
            self._event.clear()
            if not self._tickets:
                continue
            await asyncio.sleep(self._debounce)  # let a burst of arrivals share a round
            started = time.perf_counter()
            try:
                await self.round()
            except Exception:
                # The next round starts from a fresh listing; nothing is half-remembered.
                logger.exception("placement round failed; retrying in %.0fs", self._retry)
            finally:
                metrics.PLACEMENT_ROUND_SECONDS.observe(time.perf_counter() - started)

    async def round(self) -> None:
        tickets = dict(self._tickets)
        nodes, pods = await asyncio.gather(
            asyncio.to_thread(self._kube.list_nodes),
            asyncio.to_thread(self._kube.list_active_pods),
        )
        gangs = _gated_gangs(pods, tickets)
        for key in tickets.keys() - gangs.keys():
            self._tickets.pop(key, None)  # released, gone, or a newer attempt took over
        snapshot = build_snapshot(nodes, pods, levels=self._levels, reserved=reserved_gpus(pods))
        inventories = _inventories(nodes)
        shared = {k: g for k, g in gangs.items() if tickets[k].shared_mib is not None}
        if shared:
            await self._place_shared(shared, tickets, nodes, pods)
        pending: dict[str, JobKey] = {}
        jobs = []
        for key, gang in gangs.items():
            if key in shared:
                continue
            ticket = tickets[key]
            request = ticket.request
            if len(gang) != request.workers:  # a partly released gang: place the rest
                request = replace(request, workers=len(gang))
            if request.gpus_per_worker == 0:  # nothing to place: kube-scheduler spreads them
                await self._release(key, gang, None, "no GPUs requested", {})
                continue
            missing = rdma_shortfall(ticket.network, request.node_selector, snapshot)
            if missing is not None:
                self._note_wait(key, RDMA_UNAVAILABLE, missing, 0)
                continue
            name = f"{key[0]}/{key[1]}"
            pending[name] = key
            jobs.append(
                PendingJob(name, request, ticket.priority, ticket.arrival, self._skips.get(key, 0))
            )
        result = schedule(snapshot, jobs, self._policy)
        for admit in result.admitted:
            key = pending[admit.job.key]
            placement = admit.placement
            await self._release(key, gangs[key], placement, placement.describe(), inventories)
        for wait in result.waiting:
            self._note_wait(pending[wait.job.key], wait.code, wait.reason, wait.skipped)
        metrics.GANGS_WAITING.set(len(result.waiting))

    async def _place_shared(
        self,
        gangs: Mapping[JobKey, list[Pod]],
        tickets: Mapping[JobKey, Ticket],
        nodes: list[Pod],
        pods: list[Pod],
    ) -> None:
        """Shared-GPU gangs, one after another in queue order, each pinned GPU by GPU."""
        working = build_shared_nodes(nodes, pods)
        active = [mib for g in gangs.values() for pod in g if (mib := requested_mib(pod))]
        order = sorted(gangs, key=lambda k: (-tickets[k].priority, tickets[k].arrival, k))
        for key in order:
            ticket, gang = tickets[key], gangs[key]
            mib = ticket.shared_mib or 0
            selector = {k: v for k, v in ticket.request.node_selector.items() if isinstance(v, str)}
            result = place_shared(working, len(gang), mib, selector, active)
            if isinstance(result, SharedRefusal):
                reason = (
                    f"{result.reason} ({ticket.shared_how})" if ticket.shared_how else result.reason
                )
                self._note_wait(key, result.code, reason, 0)
                continue
            working = [with_pins(node, result) for node in working]
            pins = {pod["metadata"]["name"]: pin for pod, pin in zip(gang, result, strict=True)}
            summary = ", ".join(f"{p.node}/{p.gpu_uuid[:12]}" for p in result)
            await self._release_pinned(key, gang, pins, f"shared GPUs: {summary}")

    async def _release_pinned(
        self, key: JobKey, gang: list[Pod], pins: Mapping[str, Pin], summary: str
    ) -> None:
        now = _now()
        patches = []
        for pod in gang:
            pin = pins[pod["metadata"]["name"]]
            notes = {
                contract.ANNOTATION_RELEASED_AT: now,
                contract.ANNOTATION_PLACEMENT_SUMMARY: summary,
                contract.ANNOTATION_GPU_UUID: pin.gpu_uuid,
            }
            env = {"CUDA_VISIBLE_DEVICES": pin.gpu_uuid}
            patches.append((pod, build_release_patch(pod, pin.node, notes, env)))
        await self._apply_release(key, patches, summary)

    async def _release(
        self,
        key: JobKey,
        gang: list[Pod],
        placement: Placement | None,
        summary: str,
        inventories: Mapping[str, Mapping[str, Any]],
    ) -> None:
        nodes: list[str | None] = list(placement.nodes) if placement else [None] * len(gang)
        network = self._tickets[key].network if key in self._tickets else None
        notes = {
            contract.ANNOTATION_RELEASED_AT: _now(),
            contract.ANNOTATION_PLACEMENT_SUMMARY: summary,
        }
        chosen = [inventories[n] for n in dict.fromkeys(nodes) if n and n in inventories]
        link = gang_link_env(network, chosen) if len(chosen) == len(set(nodes)) else {}
        patches = []
        for pod, node in zip(gang, nodes, strict=True):
            env = {**node_network_env(network, inventories.get(node or "", {})), **link}
            patches.append((pod, build_release_patch(pod, node, notes, env)))
        await self._apply_release(key, patches, summary)

    async def _apply_release(
        self, key: JobKey, patches: list[tuple[Pod, dict[str, Any]]], summary: str
    ) -> None:
        results = await asyncio.gather(
            *(
                asyncio.to_thread(
                    self._kube.patch_pod,
                    pod["metadata"]["namespace"],
                    pod["metadata"]["name"],
                    patch,
                )
                for pod, patch in patches
            ),
            return_exceptions=True,
        )
        failed = [r for r in results if isinstance(r, BaseException)]
        for error in failed:
            if not isinstance(error, Conflict | Rejected):
                raise error
            logger.warning("%s/%s: releasing a worker failed: %s", *key, error)
        if not failed:
            self._tickets.pop(key, None)
            self._skips.pop(key, None)
            self._waits.pop(key, None)
            logger.info("%s/%s: placed: %s", *key, summary)
            metrics.GANGS_PLACED.inc()
        self._wake(key)

    def _note_wait(self, key: JobKey, code: str, reason: str, skipped: int) -> None:
        self._skips[key] = skipped
        wait = PlacementWait(code, reason)
        if self._waits.get(key) != wait:
            self._waits[key] = wait
            self._wake(key)


def _gated_gangs(pods: list[Pod], tickets: Mapping[JobKey, Ticket]) -> dict[JobKey, list[Pod]]:
    """The gated pods of each ticket's attempt, in rank order."""
    gangs: dict[JobKey, list[Pod]] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        key = (meta.get("namespace", ""), labels.get(contract.LABEL_JOB_NAME, ""))
        ticket = tickets.get(key)
        if ticket is None or meta.get("deletionTimestamp") or not is_gated(pod):
            continue
        if labels.get(contract.LABEL_ATTEMPT) == str(ticket.attempt):
            gangs.setdefault(key, []).append(pod)
    for gang in gangs.values():
        gang.sort(key=lambda pod: int(pod["metadata"]["labels"][contract.LABEL_RANK]))
    return gangs


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _inventories(nodes: list[dict[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """Each node's agent inventory by node name; nodes without a readable one are left out."""
    found = {}
    for node in nodes:
        inventory = read_inventory(node)
        if inventory is not None:
            found[node["metadata"]["name"]] = inventory
    return found


def reserved_gpus(pods: list[Pod]) -> dict[str, int]:
    """GPUs of released pods not bound yet, on the node each was pinned to."""
    reserved: dict[str, int] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        node = (meta.get("annotations") or {}).get(contract.ANNOTATION_PLACED_NODE)
        if not node or (pod.get("spec") or {}).get("nodeName") or meta.get("deletionTimestamp"):
            continue
        if not is_gated(pod):
            reserved[node] = reserved.get(node, 0) + pod_gpus(pod)
    return reserved
