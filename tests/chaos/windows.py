"""Safe windows for the chaos run's disruptions, read from the pod ledger.

A disruption is injected only into a safe window: every job it hits is Running with its
whole current gang Running and at least SAFE_MARGIN seconds left before its workers end.
Otherwise a worker could end, or the operator could place a gang on the node, between
the choice and the fault, and the job's end would depend on a race the test cannot see.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from chaos.plan import JobPlan
from cluster.controlplane import Cluster
from integration.ledgers import PodLedger
from integration.trainwave_fixtures import get_json
from trainwave import contract

SAFE_MARGIN = (
    4.0  # seconds a hit job's workers must still have to run (the operator reacts in <1 s)
)


class Windows:
    """What a disruption would hit now, and whether that is safe to hit."""

    def __init__(
        self, cluster: Cluster, namespace: str, ledger: PodLedger, jobs: list[JobPlan]
    ) -> None:
        self.cluster, self.namespace, self.ledger = cluster, namespace, ledger
        self.jobs = {j.name: j for j in jobs}

    def hit_on(self, node: str) -> set[str] | None:
        """The jobs a deletion of `node` hits; None when one of them is not in a safe window,
        a pod is on its way to the node (placed, not yet bound), or a finished worker of a
        job still running is there (pod GC would remove the end the job waits on)."""
        statuses = self.statuses()
        safe = self.safe_jobs(statuses)
        hit: set[str] = set()
        for pod in list(self.ledger.live.values()):
            meta, status = pod["metadata"], pod.get("status") or {}
            if not on(pod, node):
                continue
            job = job_of(pod)
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

    def statuses(self) -> dict[str, dict[str, Any]]:
        items = get_json(self.cluster, self.namespace, "trainingjobs")["items"]
        return {j["metadata"]["name"]: j.get("status") or {} for j in items}

    def live_workers(self) -> dict[str, str]:
        """Pod name -> job, for pods neither finished nor being deleted."""
        return {
            name: job_of(pod) for name, pod in list(self.ledger.live.items())
            if (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
            and not pod["metadata"].get("deletionTimestamp")
        }  # fmt: skip

    def safe_jobs(self, statuses: dict[str, dict[str, Any]]) -> set[str]:
        """Jobs Running with their whole current gang Running and SAFE_MARGIN left."""
        now = datetime.now(UTC)
        by_job: dict[str, list[dict[str, Any]]] = {}
        for pod in list(self.ledger.live.values()):
            by_job.setdefault(job_of(pod), []).append(pod)
        safe = set()
        for name, status in statuses.items():
            plan = self.jobs.get(name)
            if plan is None or status.get("phase") != "Running":
                continue
            attempt = str(status.get("attempt", 0))
            gang = [p for p in by_job.get(name, [])
                    if p["metadata"]["labels"].get(contract.LABEL_ATTEMPT) == attempt]  # fmt: skip
            if len(gang) == plan.workers and all(left(p, plan, now) >= SAFE_MARGIN for p in gang):
                safe.add(name)
        return safe


def left(pod: dict[str, Any], plan: JobPlan, now: datetime) -> float:
    """Seconds until the simulated worker ends; -1 when it is not Running."""
    status = pod.get("status") or {}
    if status.get("phase") != "Running" or pod["metadata"].get("deletionTimestamp"):
        return -1.0
    started = datetime.fromisoformat(status["startTime"].replace("Z", "+00:00"))
    return plan.run_for - (now - started).total_seconds()


def on(pod: dict[str, Any], node: str) -> bool:
    """Bound to the node, or placed there and not bound yet."""
    placed = (pod["metadata"].get("annotations") or {}).get(contract.ANNOTATION_PLACED_NODE)
    return node in (pod["spec"].get("nodeName"), placed)


def job_of(pod: dict[str, Any]) -> str:
    return str(pod["metadata"]["labels"].get(contract.LABEL_JOB_NAME, ""))
