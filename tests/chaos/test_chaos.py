"""The chaos suite: a seeded schedule of faults while 54 jobs with seeded failures run.

Two operator replicas on one Lease, a private pool of 8 simulated 8-GPU nodes. Jobs are
applied in six waves over the schedule (earlier when few are left), so faults meet gangs.
Faults (plan.FAULTS) run one after another; each recovers before the next. At the end:
- every job's phase, reason and counters (restarts, disruptions, ignoredRestarts,
  preemptions, attempt) are what plan.expect gives for its kind and the disruptions
  recorded against it;
- the pod names ever created (a watch ledger) are exactly its attempts' gangs, each name
  with one uid; no GPU was ever promised twice on a node;
- nothing is orphaned: every pod and Service is owned by a job of the run, each Service named
  after its job, no worker still active under a finished job, and deleting the jobs removes
  every pod and Service.
The figures go to tests/benchmarks/results/chaos.json (CHAOS_RESULTS: another path). CHAOS_SEED
picks another schedule.
"""

from __future__ import annotations

import json
import os
import platform
import random
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from chaos.faults import Chaos, Injected
from chaos.plan import DISRUPTIVE, JobPlan, Plan, expect, make_plan, violations
from cluster.deploy import OperatorProcess
from integration.ledgers import PodLedger
from integration.node_pools import node_pool
from integration.trainwave_fixtures import apply, get_json, job_manifest, wait_until

pytestmark = pytest.mark.timeout(1200)

DEFAULT_SEED = 20261123
SEED = int(os.environ.get("CHAOS_SEED", str(DEFAULT_SEED)))
WAVES = 6
LOW_WATER = 6
LAST_WAVE = 4
WORKER_NAME = re.compile(r"(.+)-a\d+-worker-\d+")
# Another seed's figures go beside the default run's, not over them. CHAOS_RESULTS puts
# them elsewhere: `make test` keeps its run's out of the tracked results (Makefile).
RESULTS = Path(
    os.environ.get("CHAOS_RESULTS")
    or Path(__file__).resolve().parents[1]
    / "benchmarks"
    / "results"
    / ("chaos.json" if SEED == DEFAULT_SEED else f"chaos-seed-{SEED}.json")
)


def manifest(job: JobPlan, selector: dict[str, str]) -> dict[str, Any]:
    body = job_manifest(
        job.name, workers=job.workers, gpus=job.gpus, result=None,
        run_policy={"failurePolicy": job.failure_policy()},
        template_spec={"nodeSelector": selector},
    )  # fmt: skip
    body["spec"]["template"]["metadata"]["annotations"] = job.simulation()
    return body


def test_chaos(cluster, namespace, running_operator, tmp_path, record_property):
    plan = make_plan(SEED)
    load_before = os.getloadavg()[0]
    standby = OperatorProcess(kubeconfig=running_operator.kubeconfig,
                              log_path=tmp_path / "standby.log", pod_name="trainwave-local-1")  # fmt: skip
    standby.start()
    replicas = {running_operator.pod_name: running_operator, standby.pod_name: standby}
    started = time.monotonic()
    with node_pool(cluster, rack_sizes=(4, 4)) as pool:
        ledger = PodLedger(cluster, namespace, gpus_per_node=8)
        ledger.relist_on_gone = True  # the API server restarts on purpose
        ledger.start()
        chaos = Chaos(cluster=cluster, namespace=namespace, pool=pool, replicas=replicas,
                      ledger=ledger, jobs=plan.jobs, rng=random.Random(SEED))  # fmt: skip
        injected: list[Injected] = []
        try:
            injected = run_schedule(plan, chaos, cluster, namespace, pool.selector)
            wait_until(lambda: all_terminal(cluster, namespace, plan), 600,
                       "every job terminal", interval=2)  # fmt: skip
            time.sleep(3)  # the operator stops what still runs under finished jobs
            found = check(plan, chaos, cluster, namespace, ledger)
        finally:
            ledger.stop()
            standby.stop()  # releases the Lease if it leads: the session operator resumes
            if not running_operator.alive():
                running_operator.start()
    wall = time.monotonic() - started
    report = figures(plan, injected, chaos, ledger, found, wall=wall, load_before=load_before)
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    record_property("chaos", report)
    print(json.dumps(report["summary"], indent=2))
    assert found == [], "\n".join(found[:40])


def run_schedule(plan: Plan, chaos: Chaos, cluster, namespace, selector) -> list[Injected]:
    """Faults in order, with the jobs applied in waves: faults take longer than jobs, and
    a disruption needs running gangs to hit. A wave goes in at the start, at even steps
    until the last LAST_WAVE faults, and early whenever fewer than LOW_WATER jobs are left
    unfinished; the last wave is kept for the last LAST_WAVE faults."""
    waves = [plan.jobs[i::WAVES] for i in range(WAVES)]
    last = len(plan.faults) - LAST_WAVE
    due = {round(i * last / (WAVES - 1)) for i in range(WAVES - 1)}
    injected = []
    for index, fault in enumerate(plan.faults):
        if index == last:
            while waves:
                apply(cluster, namespace, *(manifest(j, selector) for j in waves.pop(0)))
        elif len(waves) > 1 and (index in due or unfinished(cluster, namespace) < LOW_WATER):
            apply(cluster, namespace, *(manifest(j, selector) for j in waves.pop(0)))
        time.sleep(fault.gap)
        record = chaos.inject(fault)
        injected.append(record)
        print(f"fault {index + 1}/{len(plan.faults)}: {json.dumps(record.to_json())}")
    return injected


def unfinished(cluster, namespace) -> int:
    items = get_json(cluster, namespace, "trainingjobs")["items"]
    return sum((j.get("status") or {}).get("phase") not in ("Succeeded", "Failed") for j in items)


def all_terminal(cluster, namespace, plan: Plan) -> bool:
    items = get_json(cluster, namespace, "trainingjobs")["items"]
    phases = [(j.get("status") or {}).get("phase") for j in items]
    return len(items) == len(plan.jobs) and all(p in ("Succeeded", "Failed") for p in phases)


def check(plan: Plan, chaos: Chaos, cluster, namespace, ledger: PodLedger) -> list[str]:
    jobs = {j["metadata"]["name"]: j for j in get_json(cluster, namespace, "trainingjobs")["items"]}
    created: dict[str, set[str]] = {}
    for name in ledger.uids:
        worker = WORKER_NAME.fullmatch(name)
        created.setdefault(worker.group(1) if worker else name, set()).add(name)
    found = [f"pod {name} created {len(uids)} times" for name, uids in ledger.uids.items()
             if len(uids) > 1]  # fmt: skip
    found += [f"GPU: {error}" for error in ledger.errors]
    found += [f"pods {sorted(names)} belong to no job of the run"
              for job, names in created.items() if job not in jobs]  # fmt: skip
    for job in plan.jobs:
        status = jobs[job.name].get("status") or {}
        expected = expect(job, chaos.hits[job.name])
        found += violations(job, expected, status, created.get(job.name, set()))
    return found + orphans(cluster, namespace, jobs)


def orphans(cluster, namespace, jobs: dict[str, dict[str, Any]]) -> list[str]:
    uids = {j["metadata"]["uid"]: name for name, j in jobs.items()}
    found = []
    pods = get_json(cluster, namespace, "pods")["items"]
    services = get_json(cluster, namespace, "services")["items"]
    for kind, items in (("pod", pods), ("service", services)):
        for item in items:
            owners = {o["uid"] for o in item["metadata"].get("ownerReferences") or []}
            if not owners & set(uids):
                found.append(f"{kind} {item['metadata']['name']} is owned by no job of the run")
    # Pods on a deleted node stay Running and Terminating until pod GC removes them (40 s
    # after the node went); everything else is stopped by the operator at once.
    try:
        wait_until(lambda: not active_pods(cluster, namespace), 120, "no active worker",
                   interval=2)  # fmt: skip
    except AssertionError:
        found += [f"pod {n} still active under a finished job"
                  for n in active_pods(cluster, namespace)]  # fmt: skip
    # A job's Service comes with its gang's pods, one per attempt: `<job>`, then
    # `<job>-a<attempt>` (builders/names.py).
    named = {s["metadata"]["name"] for s in services}
    attempts = {f"{job}-a{n}" for job, body in jobs.items()
                for n in range(1, int((body.get("status") or {}).get("attempt") or 0) + 1)}  # fmt: skip
    if not named <= set(jobs) | attempts:
        found.append(f"services {sorted(named - set(jobs) - attempts)} are named after no job")
    cluster.kubectl("delete", "trainingjobs", "--all", "-n", namespace, "--wait=true",
                    timeout=180)  # fmt: skip

    def emptied() -> bool:
        left = get_json(cluster, namespace, "pods,services")["items"]
        return not left

    try:
        wait_until(emptied, 120, "garbage collection of every pod and Service", interval=2)
    except AssertionError as error:
        found.append(f"after deleting the jobs: {error}")
    return found


def active_pods(cluster, namespace) -> list[str]:
    return [p["metadata"]["name"] for p in get_json(cluster, namespace, "pods")["items"]
            if p["status"].get("phase") not in ("Succeeded", "Failed")]  # fmt: skip


def figures(plan, injected, chaos, ledger, found, *, wall, load_before) -> dict[str, Any]:
    by_kind: dict[str, int] = {}
    skipped: dict[str, int] = {}
    for record in injected:
        target = skipped if record.skipped else by_kind
        target[record.fault.kind] = target.get(record.fault.kind, 0) + 1
    kinds: dict[str, int] = {}
    for job in plan.jobs:
        kinds[job.kind] = kinds.get(job.kind, 0) + 1
    summary = {
        "seed": plan.seed,
        "jobs": len(plan.jobs),
        "pods_created": len(ledger.uids),
        "faults_injected": sum(by_kind.values()),
        "disruptions_hitting_jobs": sum(chaos.hits.values()),
        "violations": len(found),
        "wall_seconds": round(wall, 1),
    }
    return {
        "summary": summary,
        "faults_by_kind": by_kind,
        "disruptions_skipped": skipped,
        "jobs_by_kind": kinds,
        "takeover_seconds": chaos.takeovers,
        "ledger_relists_after_410": ledger.relists,
        "violations": found,
        "faults": [r.to_json() for r in injected],
        "conditions": {
            "machine": f"{os.cpu_count()} cores, {platform.machine()}, "
            f"Python {platform.python_version()}",
            "load_average_1m_before": round(load_before, 2),
            "load_average_1m_after": round(os.getloadavg()[0], 2),
            "operator": "2 replicas (local processes) on one Lease, chart RBAC",
            "nodes": "8 kwok nodes x 8 GPUs (private pool), deleted nodes not replaced",
            "date": time.strftime("%Y-%m-%d"),
            "commit": _commit(),
            "disruptive_kinds": sorted(DISRUPTIVE),
        },
    }


def _commit() -> str:
    result = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, check=False, cwd=Path(__file__).parent)  # fmt: skip
    return result.stdout.strip()
