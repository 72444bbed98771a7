"""Fault injectors of the chaos run, one method per fault kind of plan.FAULTS.

Each injector does its fault, waits until the system is whole again (both operator
replicas running, one of them holding the Lease, the control plane serving), and returns
a record of what it did. Disruptions also return the evidence the oracle needs: which
jobs they hit, read from the pod ledger at the moment of injection.

A disruption is injected only into a safe window (chaos/windows.py).
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from chaos.plan import GRACE_SECONDS, Fault, JobPlan
from chaos.windows import SAFE_MARGIN, Windows, job_of, left
from cluster.controlplane import Cluster
from cluster.deploy import OperatorProcess
from cluster.restarts import restart_component
from cluster.topology import KWOK_NODE_ANNOTATION, KWOK_NODE_VALUE
from integration.ledgers import PodLedger
from integration.node_pools import Pool
from integration.trainwave_fixtures import lease_holder, wait_until

VICTIM_SEARCH = 30.0  # how long a disruption looks for a safe window before it is skipped
# A node NotReady needs every hit worker to outlast the grace (see _not_ready_hit), which
# fewer gangs do at any moment: it looks longer before it is skipped.
NOT_READY_SEARCH = 60.0
TAKEOVER = 15 + 2 * 1.2 * 2 + 8  # leadership.Timing.takeover_bound, slack for a loaded machine
CORDON_SETTLE = 2.0  # the placer's cache sees the cordon before the node is deleted


@dataclass
class Injected:
    fault: Fault
    target: str = ""
    hit: list[str] = field(default_factory=list)  # jobs a disruption hit
    skipped: str = ""  # why a disruption found no safe window
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.fault.kind, "hold": self.fault.hold, "target": self.target,
            "hit": self.hit, "skipped": self.skipped, "seconds": round(self.seconds, 1),
        }  # fmt: skip


class Chaos(Windows):
    def __init__(
        self,
        *,
        cluster: Cluster,
        namespace: str,
        pool: Pool,
        replicas: dict[str, OperatorProcess],
        ledger: PodLedger,
        jobs: list[JobPlan],
        rng: random.Random,
    ):
        super().__init__(cluster, namespace, ledger, jobs)
        self.pool = pool
        self.replicas, self.rng = replicas, rng
        self.deleted: set[str] = set()
        self.hits: Counter[str] = Counter()
        self.takeovers: list[float] = []

    def inject(self, fault: Fault) -> Injected:
        record = Injected(fault)
        started = time.monotonic()
        getattr(self, "_" + fault.kind.replace("-", "_"))(record)
        self.heal()
        record.seconds = time.monotonic() - started
        self.hits.update(record.hit)
        return record

    # -- the operator -------------------------------------------------------------------

    def _sigkill_leader(self, record: Injected) -> None:
        leader = self._leader()
        record.target = leader
        killed = time.monotonic()
        self.replicas[leader].kill()
        self._await_new_leader(leader, killed)

    def _sigkill_standby(self, record: Injected) -> None:
        (standby,) = set(self.replicas) - {self._leader()}
        record.target = standby
        self.replicas[standby].kill()

    def _sigstop_leader_short(self, record: Injected) -> None:
        record.target = self._leader()
        self._freeze(self.replicas[record.target], record.fault.hold)

    def _sigstop_standby(self, record: Injected) -> None:
        (standby,) = set(self.replicas) - {self._leader()}
        record.target = standby
        self._freeze(self.replicas[standby], record.fault.hold)

    def _sigstop_leader_long(self, record: Injected) -> None:
        leader = self._leader()
        record.target = leader
        frozen = self.replicas[leader]
        stopped = time.monotonic()
        _signal(frozen, signal.SIGSTOP)
        try:
            self._await_new_leader(leader, stopped)
            time.sleep(max(0.0, record.fault.hold - (time.monotonic() - stopped)))
        finally:
            _signal(frozen, signal.SIGCONT)
        # It wakes past its renewDeadline: leadership.check() fails and it exits (fail-stop).
        assert frozen.process is not None
        frozen.process.wait(timeout=30)

    def _freeze(self, replica: OperatorProcess, seconds: float) -> None:
        _signal(replica, signal.SIGSTOP)
        try:
            time.sleep(seconds)
        finally:
            _signal(replica, signal.SIGCONT)

    def _leader(self) -> str:
        leader: str = wait_until(lambda: lease_holder(self.cluster) in self.replicas and
                                 lease_holder(self.cluster), TAKEOVER, "a leader")  # fmt: skip
        return leader

    def _await_new_leader(self, old: str, since: float) -> None:
        (other,) = set(self.replicas) - {old}
        wait_until(lambda: lease_holder(self.cluster) == other, TAKEOVER, f"{other} to lead",
                   interval=0.2)  # fmt: skip
        self.takeovers.append(round(time.monotonic() - since, 1))

    def heal(self) -> None:
        """As the kubelet would: restart a replica that died; then wait for a leader."""
        for replica in self.replicas.values():
            if not replica.alive():
                replica.start()
        self._leader()

    # -- the control plane -------------------------------------------------------------

    def _restart_apiserver(self, record: Injected) -> None:
        record.target = "kube-apiserver"
        restart_component("kube-apiserver", self.cluster.state_dir)

    def _restart_kwok(self, record: Injected) -> None:
        record.target = "kwok"
        restart_component("kwok", self.cluster.state_dir)

    # -- nodes and pods ----------------------------------------------------------------

    def _node_flap(self, record: Injected) -> None:
        """NotReady for less than every job's nodeNotReadySeconds: nothing may restart."""
        node = self.rng.choice(sorted(set(self.pool.nodes) - self.deleted))
        record.target = node
        self._take_down(node)
        time.sleep(record.fault.hold)
        self._bring_back(node)

    def _node_not_ready(self, record: Injected) -> None:
        """NotReady past every job's grace: each job with a worker there is disrupted once.
        kwok lets go of the node first, so its pods take no new step (their ends, queued
        already, still come: see `_not_ready_hit`); the jobs it hits are read again once
        the placer has seen the node NotReady (no gang goes there after that), and the node
        is brought back at once if they are no longer safe."""
        deadline = time.monotonic() + NOT_READY_SEARCH
        while time.monotonic() < deadline:
            node = self._search(self._safe_not_ready_node, record, deadline)
            if node is None:
                record.skipped = f"no target in a safe window for {NOT_READY_SEARCH:.0f}s"
                return
            down = time.monotonic()
            self._take_down(node)
            time.sleep(CORDON_SETTLE)
            hit = self._not_ready_hit(node)
            if hit is None:
                self._bring_back(node)  # a flap, well under the grace
                continue
            record.target, record.hit, record.skipped = node, sorted(hit), ""
            time.sleep(max(0.0, record.fault.hold - (time.monotonic() - down)))
            self._bring_back(node)
            return
        record.skipped = f"no target in a safe window for {NOT_READY_SEARCH:.0f}s"

    def _safe_not_ready_node(self) -> str | None:
        nodes = sorted(set(self.pool.nodes) - self.deleted)
        candidates = [n for n in nodes if self._not_ready_hit(n)]
        return self.rng.choice(candidates) if candidates else None

    def _not_ready_hit(self, node: str) -> set[str] | None:
        """As `hit_on`, and every worker of a hit job outlasts the grace, wherever it is.
        One elsewhere that ended first (a failure, a success) would decide the job before
        the disruption does. So would one on the node itself: kwok (v0.8.0,
        pod_controller.go playStageWorker) plays a stage it queued with a delay when the
        delay is up without asking whether it still manages the node, and a worker's end
        is queued, run-for seconds ahead, as soon as it runs. So letting go of the node
        freezes nothing already queued: the workers there still end on time (seed 4242:
        both workers of ok-46 Succeeded on the NotReady node 15 s into their run, the job
        Succeeded with them, and the oracle still counted a disruption). A worker that
        outlasts the grace ends only after the operator has judged the node."""
        hit = self.hit_on(node)
        if hit is None:
            return None
        now = datetime.now(UTC)
        workers = [
            p for p in list(self.ledger.live.values())
            if job_of(p) in hit and not p["metadata"].get("deletionTimestamp")
        ]  # fmt: skip
        if any(left(p, self.jobs[job_of(p)], now) < GRACE_SECONDS + SAFE_MARGIN for p in workers):
            return None
        return hit

    def _take_down(self, node: str) -> None:
        """kwok lets go of the node, then its Ready condition turns False, as on a kubelet
        that stopped: its pods stay as they are until it comes back."""
        self.cluster.kubectl("annotate", "node", node, f"{KWOK_NODE_ANNOTATION}-")
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        condition = {"type": "Ready", "status": "False", "reason": "KubeletNotReady",
                     "message": "chaos: kubelet stopped", "lastTransitionTime": now}  # fmt: skip
        patch = json.dumps({"status": {"conditions": [condition]}})
        self.cluster.kubectl("patch", "node", node, "--subresource=status", "--type=strategic",
                             "-p", patch)  # fmt: skip

    def _bring_back(self, node: str) -> None:
        self.cluster.kubectl("annotate", "node", node, f"{KWOK_NODE_ANNOTATION}={KWOK_NODE_VALUE}")
        wait_until(lambda: self._ready(node), 30, f"{node} Ready again")

    def _ready(self, node: str) -> bool:
        body = json.loads(self.cluster.kubectl("get", "node", node, "-o", "json").stdout)
        return any(c["type"] == "Ready" and c["status"] == "True"
                   for c in body["status"].get("conditions", []))  # fmt: skip

    def _evict(self, record: Injected) -> None:
        def victim() -> tuple[str, str] | None:
            safe = self.safe_jobs(self.statuses())
            workers = self.live_workers()
            pods = sorted(p for p, job in workers.items() if job in safe)
            if not pods:
                return None
            pod = self.rng.choice(pods)
            return pod, workers[pod]

        found = self._search(victim, record)
        if found is None:
            return
        pod, job = found
        record.target, record.hit = pod, [job]
        eviction = {"apiVersion": "policy/v1", "kind": "Eviction",
                    "metadata": {"name": pod, "namespace": self.namespace}}  # fmt: skip
        path = f"/api/v1/namespaces/{self.namespace}/pods/{pod}/eviction"
        self.cluster.kubectl("create", "--raw", path, "-f", "-", input=json.dumps(eviction))

    def _delete_node(self, record: Injected) -> None:
        if len(self.deleted) + 2 >= len(self.pool.nodes):
            record.skipped = "the pool would be too small for the widest gang"
            return
        deadline = time.monotonic() + VICTIM_SEARCH
        while time.monotonic() < deadline:
            node = self._search(self._safe_node, record, deadline)
            if node is None:
                return
            # Cordoned first, so the placer stops choosing it; then checked again, since a
            # gang placed there just before, or a worker ending, changes what it hits.
            self.cluster.kubectl("cordon", node)
            time.sleep(CORDON_SETTLE)
            hit = self.hit_on(node)
            if hit is None:
                self.cluster.kubectl("uncordon", node)
                continue
            self.cluster.kubectl("delete", "node", node, "--wait=false")
            self.deleted.add(node)
            record.target, record.hit, record.skipped = node, sorted(hit), ""
            return
        record.skipped = f"no target in a safe window for {VICTIM_SEARCH:.0f}s"

    def _safe_node(self) -> str | None:
        candidates = [n for n in sorted(set(self.pool.nodes) - self.deleted) if self.hit_on(n)]
        return self.rng.choice(candidates) if candidates else None

    def _search(self, find: Any, record: Injected, deadline: float | None = None) -> Any:
        deadline = deadline or time.monotonic() + VICTIM_SEARCH
        while time.monotonic() < deadline:
            found = find()
            if found:
                return found
            time.sleep(1.0)
        record.skipped = f"no target in a safe window for {VICTIM_SEARCH:.0f}s"
        return None


def _signal(replica: OperatorProcess, sig: signal.Signals) -> None:
    assert replica.process is not None
    os.killpg(replica.process.pid, sig)
