"""The placer: one serialized loop that starts gangs whole, where the pure round says.

Reconciles run concurrently; placement must not: two gangs decided at once
against the same snapshot could both count on the same free GPUs. So a
reconcile only hands its gang over (a Ticket) once every worker exists behind
the scheduling gate, and reads back the latest reason it waits.

One round:
1. Read the cluster from the watch-backed cache (a ClusterView: node records,
   per-node usage, gated and running workers) -- no API call. Pods released but
   not bound yet count on the node they were pinned to (annotation): the
   reservation lives in the API, so it survives an operator restart.
2. placement.round.plan_round() over every ticketed gang whose gated pods are all
   there, each asked with its stored pod's needs (tolerations, selectors,
   affinity, requests as admission left them): RDMA the cluster lacks, then the
   queue (priority, FIFO, bounded backfill, all or nothing, whole and shared GPUs
   alike), then preemption of lower-priority whole gangs.
3. Release each admitted gang (controller/releasing.py): reserve its room
   (controller/inflight.py), then, in the background, pin every pod to its node
   and lift its gate; the next round does not wait for those patches. A pod that
   changed meanwhile refuses the patch (resourceVersion) and its reservation is
   dropped; its gang's released pods keep theirs and the rest are placed again
   next round.
4. Preempt: mark each victim pod with the preemptor and delete it; the victim's
   reconcile restarts it as an uncounted attempt. Its preemptor plans no other
   preemption until those pods are gone.
5. Remember why each other gang waits; wake its reconcile when that changed, so
   the Scheduled condition tells the user.
Rounds run when a ticket arrives, when the cache sees a pod or node change (room
may have been freed) and every few seconds while anything waits.

Placed at creation (`place_now`): a reconcile about to create a whole new gang, when
no gang waits ahead of it and nothing can change or refuse its pods on the way in
(controller/admission_guards.py), asks for room first. The same round runs for that
one gang, under the same lock as every round, without preemption; if it fits, the
pods are created pinned and annotated as a release would leave them, with no gate:
one write per pod instead of two. Otherwise they are created gated and wait here as
above.
"""

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from functools import partial
from typing import Any

from trainwave import contract
from trainwave.api.reasons import Reason
from trainwave.api.trainingjob import JobKey
from trainwave.builders.gating import merged
from trainwave.controller import metrics
from trainwave.controller.api_errors import Conflict
from trainwave.controller.clusterview import ClusterView
from trainwave.controller.inflight import Inflight
from trainwave.controller.kube import KubeClient
from trainwave.controller.placement_inputs import (
    Ticket,
    gang_domains,
    gated_gangs,
    run_bounds,
    running_gang,
    with_admission_defaults,
)
from trainwave.controller.releasing import Releaser, build_shared_release, build_whole_release
from trainwave.lifecycle.draft import PlacementWait
from trainwave.placement.gang_types import Placement
from trainwave.placement.marks import close_marked, marks_of
from trainwave.placement.node_memo import NodeInfoMemo
from trainwave.placement.occupancy import gpus_by_domain, shared_fragmentation
from trainwave.placement.preemption import Preemption, RunningGang
from trainwave.placement.queueing import PendingJob, QueuePolicy
from trainwave.placement.records import PodRecord, pod_record
from trainwave.placement.round import Round, plan_round
from trainwave.placement.round import Ticket as RoundTicket
from trainwave.placement.sharing import SharedPlacement
from trainwave.placement.snapshot import ClusterSnapshot
from trainwave.placement.spread_clock import SpreadClock
from trainwave.placement.topology import Topology

logger = logging.getLogger(__name__)

Pod = dict[str, Any]
# The GPU gauges are scraped every few seconds: a busy placer sets them at most this often
# (the idle loop catches up), rather than walking every node after every round.
MEASURE_SECONDS = 1.0


class Placer:
    def __init__(
        self,
        kube: KubeClient,
        levels: Sequence[str],
        wake: Callable[[JobKey], None],
        view: Callable[[], ClusterView],
        *,
        policy: QueuePolicy | None = None,
        retry_seconds: float = 5.0,
        debounce_seconds: float = 0.05,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        settled: Callable[[str, str], bool] = lambda _namespace, _name: True,
        present: Callable[[str, str], bool] = lambda _namespace, _name: False,
    ):
        self._kube = kube
        self._levels = tuple(levels)
        self._wake = wake
        self._view = view
        self._policy = policy or QueuePolicy()
        self._retry = retry_seconds
        self._debounce = debounce_seconds
        self._clock = clock
        self._present = present
        self._marks: dict[str, datetime] = {}  # node -> straggler-until, written by us
        self._tickets: dict[JobKey, Ticket] = {}
        self._skips: dict[JobKey, int] = {}
        self._waits: dict[JobKey, PlacementWait] = {}
        self._since: dict[JobKey, tuple[int, float]] = {}  # (attempt, epoch) it first waited
        self._spread_clock = SpreadClock()  # how long rule 8 has held each gang
        self._spread_due: float | None = None  # monotonic time the first such wait ends
        self._measured: ClusterView | None = None  # the view the GPU gauges were last set from
        self._measured_at = 0.0  # time.monotonic() of that
        self._infos = NodeInfoMemo()  # node by node, only what changed is rebuilt per round
        self._running: dict[JobKey, tuple[tuple[PodRecord, ...], RunningGang | None]] = {}
        self._preempting: dict[JobKey, frozenset[JobKey]] = {}
        self._topology: tuple[int, Topology] | None = None
        self._inflight = Inflight()
        self._releaser = Releaser(kube, self._inflight, wake, self._placed, settled)
        self._event = asyncio.Event()
        # One decision at a time: a round and a gang placed at creation must not both count
        # on the same free GPUs.
        self._deciding = asyncio.Lock()

    def submit(self, key: JobKey, ticket: Ticket) -> None:
        if self._tickets.get(key) != ticket:
            self._tickets[key] = ticket
            self._event.set()

    def withdraw(self, key: JobKey) -> None:
        self._tickets.pop(key, None)
        self._skips.pop(key, None)
        self._waits.pop(key, None)
        self._preempting.pop(key, None)
        self._publish_waits()  # a deleted job must leave the waiting gauges now

    def waiting(self, key: JobKey) -> PlacementWait | None:
        return self._waits.get(key)

    def poke(self) -> None:
        """Room may have been freed: try the waiting gangs again soon."""
        if self._tickets:
            self._event.set()

    async def run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._event.wait(), timeout=self._next_wake())
            self._event.clear()
            if not self._tickets:
                # No round runs, but pods still come and go: keep the GPU gauges current.
                with contextlib.suppress(Exception):
                    await self._measure_idle()
                continue
            await asyncio.sleep(self._debounce)  # let a burst of arrivals share a round
            started = time.perf_counter()
            try:
                await self.round()
            except Exception:
                # The next round starts from the cache again; nothing is half-remembered.
                logger.exception("placement round failed; retrying in %.0fs", self._retry)
            finally:
                metrics.PLACEMENT_ROUND_SECONDS.observe(time.perf_counter() - started)

    async def place_now(
        self, key: JobKey, ticket: Ticket, pods: Sequence[Mapping[str, Any]]
    ) -> list[dict[str, Any]] | None:
        """A whole new gang's pods (built, gated, not created yet), pinned where the round
        puts them, annotated and without the gate; or None: create them gated and submit
        the ticket. None whenever another gang waits (it comes first), the gang does not
        fit now, or it would need preemption: those are the queue's to decide."""
        if self._tickets or self._preempting:
            return None
        # A name another pod still holds (an old job's worker, terminating) refuses that
        # create and not its siblings': pinned and ungated, they would run without it.
        names = [pod["metadata"]["name"] for pod in pods]
        taken = [name for name in names if self._present(key[0], name)]
        if taken:
            logger.info("%s/%s: not placed at creation: %s exists already", *key, taken[0])
            return None
        async with self._deciding:
            if self._tickets:  # one arrived while the lock was held
                return None
            started = time.perf_counter()
            records = [pod_record(with_admission_defaults(pod)) for pod in pods]
            gang = [r for r in records if r is not None and r.needs is not None]
            if not gang or len(gang) != len(pods) or len(gang) != ticket.request.workers:
                return None
            view = await asyncio.to_thread(self._view)
            self._inflight.settle(view)
            # A one-ticket round through the same code as the queue's, without preemption:
            # the queue's rounds decide that.
            _, result, _ = await self._decide(view, {key: (ticket, gang)}, running=[])
            metrics.PLACEMENT_ROUND_SECONDS.observe(time.perf_counter() - started)
            admitted = result.admitted[0].placement if len(result.admitted) == 1 else None
            if not isinstance(admitted, Placement):
                return None
            placement = admitted
            inventories = view.inventories(placement.nodes)
            release = build_whole_release(key, gang, placement, inventories, ticket.network)
            for pod, node, _, _ in release.targets:
                self._inflight.add_unborn(pod, node)
        logger.info("%s/%s: placed at creation: %s", *key, release.summary)
        return [merged(pod, patch) for pod, (_, patch) in zip(pods, release.patches, strict=True)]

    def forget_unborn(self, namespace: str, name: str) -> None:
        """A pod placed at creation that the API server refused: it holds nothing."""
        self._inflight.forget_unborn(namespace, name)

    async def round(self) -> None:
        async with self._deciding:
            await self._round()

    async def _round(self) -> None:
        tickets = dict(self._tickets)
        view = await asyncio.to_thread(self._view)
        self._inflight.settle(view)
        gangs = {
            key: gang
            for key, gang in gated_gangs(view, tickets).items()
            if not self._inflight.covers(gang)  # released; the cache has not seen it yet
        }
        self._preempting = {
            k: v for k, v in self._preempting.items() if any(view.workers.get(g) for g in v)
        }
        running = self._running_gangs(view, exclude=gangs.keys())
        for key in await self._place_near(view, tickets, gangs):
            del gangs[key]
        entries = {key: (tickets[key], gang) for key, gang in gangs.items()}
        snapshot, result, names = await self._decide(view, entries, running=running)
        for admit in result.admitted:
            key = names[admit.job.key]
            if admit.on_held_room:
                metrics.GANGS_ON_HELD_ROOM.inc()
                logger.info(
                    "%s/%s: backfilled onto held room: its maxRunSeconds ends it before the "
                    "gang the room is held for could start",
                    *key,
                )
            if isinstance(admit.placement, SharedPlacement):
                release = build_shared_release(key, gangs[key], admit.placement)
            else:
                network = tickets[key].network
                inventories = view.inventories(admit.placement.nodes)
                release = build_whole_release(
                    key, gangs[key], admit.placement, inventories, network
                )
            self._releaser.dispatch(release)
        self._spread_due = None
        for wait in result.waiting:
            key = names[wait.job.key]
            if wait.code == Reason.WAITING_FOR_PREFERRED_LEVEL:
                ticket = tickets[key]
                self._spread_clock.held(key, ticket.attempt, time.monotonic())
                due = self._spread_clock.ends_at(key, ticket.attempt, ticket.spread_wait)
                if due is not None:
                    self._spread_due = min(due, self._spread_due or due)
            how = tickets[key].shared_how
            reason = (
                f"{wait.reason} ({how})" if how and wait.job.request.shared_mib else wait.reason
            )
            self._note_wait(key, wait.code, reason, wait.skipped)
        for preemption in result.preemptions:
            await self._preempt(preemption, names, view)
        metrics.GANGS_WAITING.set(len(result.waiting))
        self._publish_waits()
        if time.monotonic() - self._measured_at >= MEASURE_SECONDS:
            await asyncio.to_thread(self._measure, view, snapshot)

    async def _place_near(
        self,
        view: ClusterView,
        tickets: Mapping[JobKey, Ticket],
        gangs: Mapping[JobKey, list[PodRecord]],
    ) -> list[JobKey]:
        """Replacement workers of running gangs (a gang partly released: its other workers
        hold their nodes) placed in the gang's own topology domain, narrowest first (its
        rack, then its spine), each a one-ticket round through `_decide` with that domain
        as a node selector; the keys placed. A replacement with no room there goes to the
        queue's round below, whose objective places it like any worker. Ahead of the queue:
        it belongs to a gang that runs, whose other workers wait for it in rendezvous."""
        placed: list[JobKey] = []
        labels = {node.name: node.labels for node in view.nodes}
        for key, gang in gangs.items():
            ticket = tickets[key]
            released = [
                p.node
                for p in view.workers.get(key, ())
                if p.worker is not None and p.worker.attempt == ticket.attempt
                and not p.gated and p.node and not p.deleting
            ]  # fmt: skip
            if not released or ticket.request.shared_mib is not None:
                continue
            for selector in gang_domains(self._levels, labels, released):
                request = ticket.request
                near = replace(request, node_selector={**request.node_selector, **selector})
                _, result, _ = await self._decide(
                    view, {key: (replace(ticket, request=near), gang)}, running=[]
                )
                admitted = result.admitted[0].placement if len(result.admitted) == 1 else None
                if isinstance(admitted, Placement):
                    inventories = view.inventories(admitted.nodes)
                    release = build_whole_release(key, gang, admitted, inventories, ticket.network)
                    self._releaser.dispatch(release)
                    logger.info("%s/%s: replacement placed near its gang: %s", *key, selector)
                    placed.append(key)
                    break
        return placed

    async def _decide(
        self,
        view: ClusterView,
        gangs: Mapping[JobKey, tuple[Ticket, list[PodRecord]]],
        *,
        running: Sequence[RunningGang],
    ) -> tuple[ClusterSnapshot, Round, dict[str, JobKey]]:
        """The one way into placement, for a round and for a gang placed at creation alike:
        the snapshot (reservations counted), each gang asked with its stored (or about to
        be created) pods' needs, and the pure round. Returns the snapshot, the round and
        the round's job names back to their keys."""
        started = time.perf_counter()
        # Building the snapshot and deciding are pure and can take a few hundred ms on a
        # large cluster: off the event loop, so kopf's watches and the reconciles go on.
        snapshot = await asyncio.to_thread(lambda: self._inflight.apply(self._snapshot(view)))
        names: dict[str, JobKey] = {}
        round_tickets = []
        for key, (ticket, gang) in gangs.items():
            name = f"{key[0]}/{key[1]}"
            names[name] = key
            request = replace(ticket.request, workers=len(gang), pod=gang[0].needs)
            # The bound its pods carry: the one the deadline will hold it to once released.
            bound = gang[0].worker.max_run_seconds if gang[0].worker else 0
            job = PendingJob(
                name,
                request,
                ticket.priority,
                ticket.arrival,
                self._skips.get(key, 0),  # 0 for a gang not queued yet
                may_spread=self._may_spread(key, ticket),
                max_run=float(bound) if bound else None,
            )
            round_tickets.append(RoundTicket(job, ticket.network))
        result = await asyncio.to_thread(
            partial(
                plan_round,
                snapshot,
                round_tickets,
                self._clock(),
                policy=self._policy,
                shared_shapes=view.shared_shapes,
                running=running,
                bounds=run_bounds(running, self._clock().timestamp()) if running else None,
            )
        )
        metrics.PLACEMENT_DECISION_SECONDS.observe(time.perf_counter() - started)
        return snapshot, result, names

    def _next_wake(self) -> float:
        """Seconds until the next round without news: the retry period, or sooner when a
        gang's preferredLevelWaitSeconds ends first (its round then starts it spread at
        once rather than at the next retry)."""
        if self._spread_due is None:
            return self._retry
        return max(0.0, min(self._retry, self._spread_due - time.monotonic()))

    def _may_spread(self, key: JobKey, ticket: Ticket) -> bool:
        """Whether this attempt has waited its preferredLevelWaitSeconds, counted from the
        first round that held it for its preferred level (placement/spread_clock.py); a
        round runs when the first such wait ends (`_next_wake`)."""
        return self._spread_clock.may_spread(
            key, ticket.attempt, ticket.spread_wait, time.monotonic()
        )

    def _publish_waits(self) -> None:
        """Set the waiting gauges from the gangs that still wait (placed ones are gone)."""
        now = time.time()
        waiting = {k: w for k, w in self._waits.items() if k in self._tickets}
        since = {}
        for key in waiting:
            attempt = self._tickets[key].attempt
            known = self._since.get(key)
            since[key] = known if known and known[0] == attempt else (attempt, now)
        self._since = since
        self._spread_clock.keep_only({k: t.attempt for k, t in self._tickets.items()})
        rows = tuple((*key, waiting[key].code, since[key][1]) for key in sorted(waiting))
        metrics.PLACEMENT.state = replace(metrics.PLACEMENT.state, waiting=rows)

    def _measure(self, view: ClusterView, snapshot: ClusterSnapshot) -> None:
        """GPU gauges from the round's snapshot: O(nodes x levels), off the event loop."""
        metrics.PLACEMENT.state = replace(
            metrics.PLACEMENT.state,
            gpus=gpus_by_domain(snapshot),
            shared=shared_fragmentation(snapshot, view.shared_shapes),
        )
        self._measured = view
        self._measured_at = time.monotonic()

    async def _measure_idle(self) -> None:
        view = await asyncio.to_thread(self._view)
        if view is not self._measured:  # the cache hands out the same view until a change
            snapshot = await asyncio.to_thread(lambda: self._inflight.apply(self._snapshot(view)))
            await asyncio.to_thread(self._measure, view, snapshot)

    def _snapshot(self, view: ClusterView) -> ClusterSnapshot:
        """The round's snapshot; the topology tree is reused while node labels stay the same."""
        known = self._topology
        reuse = (
            known[1] if known and view.labels_version and known[0] == view.labels_version else None
        )
        snapshot = view.snapshot(self._levels, topology=reuse, memo=self._infos)
        self._topology = (view.labels_version, snapshot.topology)
        now = self._clock()
        # Marks this operator wrote and the node watch may not show yet, then the nodes'.
        self._marks = {node: until for node, until in self._marks.items() if until > now}
        marks = {**self._marks, **marks_of(view.nodes)}
        return close_marked(snapshot, marks, now) if marks else snapshot

    def mark_node(self, node: str, until: datetime) -> None:
        """Keep new gangs off `node` until `until` (a straggler was replaced there), from
        the next round on, before the node's annotation comes back through the watch."""
        self._marks[node] = max(until, self._marks.get(node, until))

    def _running_gangs(self, view: ClusterView, exclude: Iterable[JobKey]) -> list[RunningGang]:
        """Trainwave gangs holding resources now, as preemption candidates; each job's gang
        is kept while the cache hands out the same pods for it (the view's per-job tuples
        are reused until that job's pods change)."""
        known, fresh = self._running, {}
        for key, pods in view.workers.items():
            hit = known.get(key)
            fresh[key] = (
                pods,
                hit[1] if hit is not None and hit[0] is pods else running_gang(key, pods),
            )
        self._running = fresh
        skip = set(exclude)
        return [gang for key, (_, gang) in fresh.items() if gang is not None and key not in skip]

    async def drain(self) -> None:
        """Wait until every gang handed to the background has been patched."""
        await self._releaser.drain()

    def _placed(self, key: JobKey) -> None:
        """Every pod of the gang released: it waits no more."""
        self._tickets.pop(key, None)
        self._skips.pop(key, None)
        self._waits.pop(key, None)

    async def _preempt(
        self, preemption: Preemption, names: Mapping[str, JobKey], view: ClusterView
    ) -> None:
        preemptor = names[preemption.preemptor]
        if preemptor in self._preempting:
            return  # its earlier victims are still going away
        victims = frozenset(_key(name) for name in preemption.victims)
        self._preempting[preemptor] = victims
        logger.info("%s/%s: %s", *preemptor, preemption.message)
        patch = {
            "metadata": {"annotations": {contract.ANNOTATION_PREEMPTED_BY: preemption.preemptor}}
        }
        for victim in victims:
            live = [p for p in view.workers.get(victim, ()) if not p.deleting and p.worker]
            attempts = {p.worker.attempt for p in live if p.worker}
            for attempt in attempts:
                await asyncio.to_thread(
                    self._kube.note_preemption, *victim, preemption.preemptor, attempt
                )
            for pod in live:
                # Marked first, so the victim's reconcile knows why its pods went.
                with contextlib.suppress(Conflict):
                    await asyncio.to_thread(self._kube.patch_pod, pod.namespace, pod.name, patch)
                await asyncio.to_thread(self._kube.delete_pod, pod.namespace, pod.name)
            metrics.GANGS_PREEMPTED.inc()
            self._wake(victim)
        self._note_wait(
            preemptor, Reason.PREEMPTING, f"preempting {', '.join(sorted(preemption.victims))}", 0
        )

    def _note_wait(self, key: JobKey, code: str, reason: str, skipped: int) -> None:
        self._skips[key] = skipped
        wait = PlacementWait(code, reason)
        if self._waits.get(key) != wait:
            self._waits[key] = wait
            self._wake(key)


def _key(name: str) -> JobKey:
    namespace, _, job = name.partition("/")
    return namespace, job
