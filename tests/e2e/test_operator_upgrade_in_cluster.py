"""`helm upgrade` of the published chart while jobs run, with the operator as real pods.

The changed values roll the operator's Deployment the chart's way (RollingUpdate, maxSurge
1, maxUnavailable 0): the kubelet starts a new pod, sends SIGTERM to an old one once the new
one is Ready, and the Lease passes to an upgraded pod. The jobs' workers run on the kwok
nodes (they never finish), so the real node holds only trainwave's own pods. No worker may
be recreated and no job may change phase; a job applied afterwards runs to the end. The
integration tier runs the same upgrade with local processes standing in for the pods
(tests/integration/test_operator_upgrade.py); here the kubelet does the replacing.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from e2e.conftest import Release
from integration.ledgers import JobLedger, PodLedger
from integration.trainwave_fixtures import (
    apply,
    get_json,
    job_manifest,
    wait_for_phase,
    wait_until,
    worker_pods,
)

pytestmark = pytest.mark.timeout(420)

JOBS, WORKERS = 10, 2
KWOK_NODES = {"type": "kwok"}


def operator_args(pod: dict[str, Any]) -> list[str]:
    args: list[str] = pod["spec"]["containers"][0].get("args", [])
    return args


def all_running(release: Release, namespace: str) -> dict[str, str] | None:
    items = get_json(release.cluster, namespace, "trainingjobs")["items"]
    phases = {item["metadata"]["name"]: (item.get("status") or {}).get("phase") for item in items}
    return phases if len(phases) == JOBS and set(phases.values()) == {"Running"} else None


def test_helm_upgrade_rolls_the_operator_pods_and_recreates_no_worker(
    release: Release, namespace: str
) -> None:
    cluster = release.cluster
    apply(cluster, namespace, *(
        job_manifest(f"run-{i}", workers=WORKERS, result=None,
                     template_spec={"nodeSelector": KWOK_NODES})
        for i in range(JOBS)
    ))  # fmt: skip
    wait_until(lambda: all_running(release, namespace), 120, "all jobs Running", interval=1)
    before = {
        pod["metadata"]["name"]: pod["metadata"]["uid"]
        for i in range(JOBS)
        for pod in worker_pods(cluster, namespace, f"run-{i}")
    }
    assert len(before) == JOBS * WORKERS
    old_pods = {pod["metadata"]["name"] for pod in release.operator_pods()}
    pods = PodLedger(cluster, namespace, gpus_per_node=8).start()
    jobs = JobLedger(cluster, namespace).start()
    try:
        release.upgrade({**release.values, "logLevel": "debug"}, "values-debug.yaml")
        upgraded = release.operator_pods()
        assert {pod["metadata"]["name"] for pod in upgraded}.isdisjoint(old_pods), upgraded
        assert all("debug" in json.dumps(operator_args(pod)) for pod in upgraded)
        names = [pod["metadata"]["name"] for pod in upgraded]
        wait_until(lambda: any(release.leader().startswith(f"{n}_") for n in names), 60,
                   "an upgraded operator pod to hold the Lease", interval=0.5)  # fmt: skip
        apply(
            cluster,
            namespace,
            job_manifest("after-upgrade", template_spec={"nodeSelector": KWOK_NODES}),
        )
        wait_for_phase(cluster, namespace, "after-upgrade", "Succeeded", timeout=120)
    finally:
        pods.stop()
        jobs.stop()
        release.upgrade(release.values, "values-restored.yaml")

    after = {name: uids for name, uids in pods.uids.items() if name in before}
    assert after == {name: {uid} for name, uid in before.items()}, "a worker was recreated"
    changed = {n: p for n, p in jobs.phases.items() if n.startswith("run-") and p != ["Running"]}
    assert changed == {}, f"jobs changed phase during the upgrade: {changed}"
    assert pods.errors == []
    assert jobs.errors == []
