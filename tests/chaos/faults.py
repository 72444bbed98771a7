"""Fault injectors of the chaos run, one method per fault kind of plan.FAULTS.

Each injector does its fault, waits until the system is whole again (both operator
replicas running, one of them holding the Lease, the control plane serving), and returns
a record of what it did. Disruptions also return the evidence the oracle needs: which
jobs they hit, read from the pod ledger at the moment of injection.

A disruption is injected only into a safe window: every job it hits is Running with its
whole current gang Running and at least SAFE_MARGIN seconds left before its workers end.
Otherwise a worker could end, or the operator could place a gang on the node, between
the choice and the fault, and the job's end would depend on a race the test cannot see.
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

from chaos.plan import Fault, JobPlan
from cluster.controlplane import Cluster
from cluster.deploy import OperatorProcess
from cluster.restarts import restart_component
from cluster.topology import KWOK_NODE_ANNOTATION, KWOK_NODE_VALUE
from integration.ledgers import PodLedger
from integration.node_pools import Pool
from integration.trainwave_fixtures import get_json, lease_holder, wait_until
from trainwave import contract

SAFE_MARGIN = (
    4.0  # seconds a hit job's workers must still have to run (the operator reacts in <1 s)
)
VICTIM_SEARCH = 30.0  # how long a disruption looks for a safe window before it is skipped
TAKEOVER = 15 + 1.2 * 2 + 8  # leaseDuration + retryPeriod jitter, slack for a loaded machine
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


class Chaos:
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
        self.cluster, self.namespace, self.pool = cluster, namespace, pool
        self.replicas, self.ledger, self.rng = replicas, ledger, rng
        self.jobs = {j.name: j for j in jobs}
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
        self.cluster.kubectl("annotate", "node", node, f"{KWOK_NODE_ANNOTATION}-")
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        condition = {"type": "Ready", "status": "False", "reason": "KubeletNotReady",
                     "message": "chaos: kubelet stopped", "lastTransitionTime": now}  # fmt: skip
        patch = json.dumps({"status": {"conditions": [condition]}})
        self.cluster.kubectl("patch", "node", node, "--subresource=status", "--type=strategic",
                             "-p", patch)  # fmt: skip
        time.sleep(record.fault.hold)
        self.cluster.kubectl("annotate", "node", node, f"{KWOK_NODE_ANNOTATION}={KWOK_NODE_VALUE}")
        wait_until(lambda: self._ready(node), 30, f"{node} Ready again")

    def _ready(self, node: str) -> bool:
        body = json.loads(self.cluster.kubectl("get", "node", node, "-o", "json").stdout)
        return any(c["type"] == "Ready" and c["status"] == "True"
                   for c in body["status"].get("conditions", []))  # fmt: skip

    def _evict(self, record: Injected) -> None:
        def victim() -> tuple[str, str] | None:
            safe = self._safe_jobs(self._statuses())
            workers = self._live_workers()
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
            hit = self._hit_on(node)
            if hit is None:
                self.cluster.kubectl("uncordon", node)
                continue
            self.cluster.kubectl("delete", "node", node, "--wait=false")
            self.deleted.add(node)
            record.target, record.hit, record.skipped = node, sorted(hit), ""
            return
        record.skipped = f"no target in a safe window for {VICTIM_SEARCH:.0f}s"

    def _safe_node(self) -> str | None:
        candidates = [n for n in sorted(set(self.pool.nodes) - self.deleted) if self._hit_on(n)]
        return self.rng.choice(candidates) if candidates else None

    def _hit_on(self, node: str) -> set[str] | None:
        """The jobs a deletion of `node` hits; None when one of them is not in a safe window,
        a pod is on its way to the node (placed, not yet bound), or a finished worker of a
        job still running is there (pod GC would remove the end the job waits on)."""
        statuses = self._statuses()
        safe = self._safe_jobs(statuses)
        hit: set[str] = set()
        for pod in list(self.ledger.live.values()):
            meta, spec, status = pod["metadata"], pod["spec"], pod.get("status") or {}
            placed = (meta.get("annotations") or {}).get(contract.ANNOTATION_PLACED_NODE)
            if node not in (spec.get("nodeName"), placed):
                continue
            job = _job_of(pod)
            if status.get("phase") in ("Succeeded", "Failed"):
                current = statuses.get(job, {})
                if current.get("phase") not in ("Succeeded", "Failed") and meta["labels"].get(
                    contract.LABEL_ATTEMPT
                ) == str(current.get("attempt", 0)):
                    return None
            elif meta.get("deletionTimestamp"):
                continue  # a stale worker on its way out
            elif job in safe:
                hit.add(job)
            else:
                return None
        return hit or None

    def _search(self, find: Any, record: Injected, deadline: float | None = None) -> Any:
        deadline = deadline or time.monotonic() + VICTIM_SEARCH
        while time.monotonic() < deadline:
            found = find()
            if found:
                return found
            time.sleep(1.0)
        record.skipped = f"no target in a safe window for {VICTIM_SEARCH:.0f}s"
        return None

    def _statuses(self) -> dict[str, dict[str, Any]]:
        items = get_json(self.cluster, self.namespace, "trainingjobs")["items"]
        return {j["metadata"]["name"]: j.get("status") or {} for j in items}

    def _live_workers(self) -> dict[str, str]:
        """Pod name -> job, for pods neither finished nor being deleted."""
        return {
            name: _job_of(pod) for name, pod in list(self.ledger.live.items())
            if (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
            and not pod["metadata"].get("deletionTimestamp")
        }  # fmt: skip

    def _safe_jobs(self, statuses: dict[str, dict[str, Any]]) -> set[str]:
        """Jobs Running with their whole current gang Running and SAFE_MARGIN left."""
        now = datetime.now(UTC)
        by_job: dict[str, list[dict[str, Any]]] = {}
        for pod in list(self.ledger.live.values()):
            by_job.setdefault(_job_of(pod), []).append(pod)
        safe = set()
        for name, status in statuses.items():
            plan = self.jobs.get(name)
            if plan is None or status.get("phase") != "Running":
                continue
            attempt = str(status.get("attempt", 0))
            gang = [p for p in by_job.get(name, [])
                    if p["metadata"]["labels"].get(contract.LABEL_ATTEMPT) == attempt]  # fmt: skip
            if len(gang) == plan.workers and all(_left(p, plan, now) >= SAFE_MARGIN for p in gang):
                safe.add(name)
        return safe


def _left(pod: dict[str, Any], plan: JobPlan, now: datetime) -> float:
    """Seconds until the simulated worker ends; -1 when it is not Running."""
    status = pod.get("status") or {}
    if status.get("phase") != "Running" or pod["metadata"].get("deletionTimestamp"):
        return -1.0
    started = datetime.fromisoformat(status["startTime"].replace("Z", "+00:00"))
    return plan.run_for - (now - started).total_seconds()


def _job_of(pod: dict[str, Any]) -> str:
    return str(pod["metadata"]["labels"].get(contract.LABEL_JOB_NAME, ""))


def _signal(replica: OperatorProcess, sig: signal.Signals) -> None:
    assert replica.process is not None
    os.killpg(replica.process.pid, sig)
