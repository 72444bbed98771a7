"""`helm upgrade` with changed values while 20 jobs run, then a rolling replacement of both
operator replicas with processes started from the upgraded Deployment's arguments: no
worker of a running job is recreated and no job changes phase.

The integration tier's nodes are kwok's, so the Deployment's pods run nothing; the operator
replicas are local processes, replaced the way the chart's RollingUpdate replaces pods
(maxSurge 1, maxUnavailable 0): a new one starts as a standby, then an old one gets SIGTERM.
This tier can time each Lease hand-over; tests/e2e/test_operator_upgrade_in_cluster.py runs
the same upgrade with real pods, replaced by the kubelet.
"""

from __future__ import annotations

import re
import time

import pytest

from cluster.deploy import NAMESPACE, OperatorProcess, install_chart
from integration.ledgers import JobLedger, PodLedger
from integration.node_pools import node_pool
from integration.trainwave_fixtures import (
    apply,
    get_json,
    job_manifest,
    lease_holder,
    wait_for_phase,
    wait_until,
    worker_pods,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(360)]

JOBS, WORKERS = 20, 2
CHANGED = ("--set", "logLevel=debug", "--set", "leaderElection.leaseDuration=20",
           "--set", "leaderElection.renewDeadline=12")  # fmt: skip
# Flags the local processes choose themselves (ports on this machine).
LOCAL_FLAGS = {"--metrics-port", "--health-port"}


def deployed_args(cluster) -> tuple[str, ...]:
    """The operator's arguments as the upgraded Deployment now states them."""
    deployment = get_json(cluster, NAMESPACE, "deploy", "-l", "app.kubernetes.io/name=trainwave")
    (item,) = deployment["items"]
    (container,) = item["spec"]["template"]["spec"]["containers"]
    args: list[str] = container["args"][1:]  # after "operator"
    kept: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg in LOCAL_FLAGS:
            skip = True
        else:
            kept.append(arg)
    return tuple(kept)


def all_running(cluster, namespace):
    def check():
        phases = {
            item["metadata"]["name"]: (item.get("status") or {}).get("phase")
            for item in get_json(cluster, namespace, "trainingjobs")["items"]
        }
        return phases if set(phases.values()) == {"Running"} else None

    return check


def roll(cluster, olds, args, new: list[OperatorProcess], logs) -> list[float]:
    """Replace each old replica by one started with `args`, new first (maxSurge 1,
    maxUnavailable 0); returns how long each hand-over of the Lease took."""
    handovers = []
    for index, old in enumerate(olds):
        replacement = OperatorProcess(
            kubeconfig=old.kubeconfig, log_path=logs / f"new-{index}.log",
            pod_name=f"trainwave-local-new-{index}", extra_args=args,
        )  # fmt: skip
        new.append(replacement)
        replacement.start()  # Ready as a standby before an old one goes
        leading = lease_holder(cluster) == old.pod_name
        stopped = time.monotonic()
        old.stop()  # SIGTERM: finishes in-flight writes, then releases the lease
        if leading:
            wait_until(lambda: lease_holder(cluster).startswith("trainwave-local"), 10,
                       "a replica to take the released lease", interval=0.1)  # fmt: skip
            handovers.append(time.monotonic() - stopped)
    return handovers


def test_helm_upgrade_recreates_no_worker_and_changes_no_phase(
    cluster, namespace, running_operator, tmp_path, record_property
):
    old_args = deployed_args(cluster)
    old_standby = OperatorProcess(
        kubeconfig=running_operator.kubeconfig, log_path=tmp_path / "old-standby.log",
        pod_name="trainwave-local-1", extra_args=old_args,
    )  # fmt: skip
    new: list[OperatorProcess] = []
    ledgers: list[PodLedger | JobLedger] = []
    with node_pool(cluster, rack_sizes=(3, 2)) as pool:  # 40 GPUs: room for all 20 gangs
        try:
            old_standby.start()
            apply(cluster, namespace, *(
                job_manifest(f"run-{i}", workers=WORKERS, result=None,
                             template_spec={"nodeSelector": pool.selector})
                for i in range(JOBS)
            ))  # fmt: skip
            wait_until(all_running(cluster, namespace), 120, "all 20 jobs Running", interval=1)
            before = {
                pod["metadata"]["name"]: pod["metadata"]["uid"]
                for i in range(JOBS)
                for pod in worker_pods(cluster, namespace, f"run-{i}")
            }
            assert len(before) == JOBS * WORKERS
            pods = PodLedger(cluster, namespace, gpus_per_node=8).start()
            jobs = JobLedger(cluster, namespace).start()
            ledgers += [pods, jobs]

            install_chart(cluster, *CHANGED)
            new_args = deployed_args(cluster)
            assert "debug" in new_args
            assert new_args != old_args
            handovers = roll(cluster, (running_operator, old_standby), new_args, new, tmp_path)
            wait_until(lambda: lease_holder(cluster).startswith("trainwave-local-new-"), 30,
                       "an upgraded replica to lead", interval=0.2)  # fmt: skip
            leader = next(p for p in new if p.pod_name == lease_holder(cluster))
            # The upgraded leader has reconciled every running job, not merely idled.
            wait_until(lambda: _reconciles(leader) >= JOBS, 60, "the new leader to reconcile")
            # And it acts: a job applied after the upgrade runs to the end.
            apply(cluster, namespace, job_manifest("after-upgrade"))
            wait_for_phase(cluster, namespace, "after-upgrade", "Succeeded")
            time.sleep(2)  # anything the new leader would wrongly do to the old jobs, it has
        finally:
            for process in new:
                process.stop()
            old_standby.stop()
            install_chart(cluster)  # the session's other tests expect the default values
            if not running_operator.alive():
                running_operator.start()
            for ledger in ledgers:
                ledger.stop()

    record_property("lease_handover_seconds", handovers)
    print(f"lease handover on SIGTERM of the leader: {', '.join(f'{h:.1f}s' for h in handovers)}")
    # A released Lease is taken on the standby's next try, within 1.2 x retryPeriod (2.4 s);
    # the slack covers the API round trip and kubectl polling on a loaded machine.
    assert handovers, "the leader was never replaced"
    assert all(h < 1.2 * 2 + 2.5 for h in handovers), handovers
    after = {name: uids for name, uids in pods.uids.items() if name in before}
    assert after == {name: {uid} for name, uid in before.items()}, "a worker was recreated"
    assert set(pods.uids) - set(before) == {"after-upgrade-a0-worker-0"}
    changed = {n: p for n, p in jobs.phases.items() if n.startswith("run-") and p != ["Running"]}
    assert changed == {}, f"jobs changed phase during the upgrade: {changed}"
    assert pods.errors == []
    assert jobs.errors == []


def _reconciles(process: OperatorProcess) -> int:
    found = re.search(
        r"^trainwave_reconcile_duration_seconds_count (\d+)", process.metrics(), re.MULTILINE
    )
    return int(found.group(1)) if found else 0
