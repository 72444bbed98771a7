"""A benchmark's own local cluster with trainwave installed and its operator running.

Each benchmark gets a state directory of its own under the cache (never the
integration tests' cluster), so a benchmark run cannot disturb a test session
and starts from a known node set. The chart is installed and the operator runs
as the chart's ServiceAccount, exactly as in the integration tests.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from cluster.controlplane import (
    DEFAULT_TOPOLOGY,
    START_TIMEOUT,
    Cluster,
    cache_dir,
    ensure_cluster,
)
from cluster.deploy import OperatorProcess, install_chart, service_account_kubeconfig


@dataclass(frozen=True)
class BenchCluster:
    cluster: Cluster
    operator: OperatorProcess
    workdir: Path  # logs and kubeconfigs of this run


@contextmanager
def operator_cluster(
    topology: Path,
    state_name: str,
    namespace: str,
    *,
    audit_users: Sequence[str] = (),
    keep_cluster: bool = False,
    operator_args: tuple[str, ...] = (),
    start_timeout: float = 60,
    cluster_timeout: float = START_TIMEOUT,
) -> Iterator[BenchCluster]:
    """Start (or reuse) the cluster in `state_name`, install the chart, recreate `namespace`,
    start the operator; stop all of it afterwards (the cluster stays up with `keep_cluster`,
    for a quick re-run). The operator may be stopped early. `audit_users`: see
    ensure_cluster. `start_timeout`: seconds for the operator to turn healthy (a traced
    one starts slowly); `cluster_timeout`: for the cluster and its nodes (4,096 take minutes)."""
    state = cache_dir() / state_name
    cluster = ensure_cluster(
        topology, state_dir=state, timeout=cluster_timeout, audit_users=audit_users
    )
    try:
        install_chart(cluster)
        fresh_namespace(cluster, namespace)
        workdir = state / "bench"
        workdir.mkdir(exist_ok=True)
        operator = OperatorProcess(
            kubeconfig=service_account_kubeconfig(cluster, workdir / "operator.kubeconfig"),
            log_path=workdir / "operator.log",
            extra_args=operator_args,
        )
        try:
            # Inside the try: an operator that never turned healthy is stopped too.
            operator.start(timeout=start_timeout)
            yield BenchCluster(cluster, operator, workdir)
        finally:
            operator.stop()
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
    finally:
        if not keep_cluster:
            cluster.stop()


@contextmanager
def real_node_cluster(count: int = 1) -> Iterator[Cluster]:
    """The local cluster with `count` real nodes (root only), stopped afterwards unless
    TRAINWAVE_KEEP_CLUSTER=1: one cluster with real nodes per machine, as in the e2e tier."""
    cluster = ensure_cluster(DEFAULT_TOPOLOGY, real_nodes=count, timeout=600)
    try:
        yield cluster
    finally:
        if cluster.started and os.environ.get("TRAINWAVE_KEEP_CLUSTER") != "1":
            cluster.stop()


def fresh_namespace(cluster: Cluster, namespace: str) -> None:
    """Delete what an interrupted run left, then create the namespace and wait for its
    `default` ServiceAccount (pods are refused until it exists)."""
    cluster.kubectl("delete", "namespace", namespace, "--ignore-not-found", "--wait=true",
                    timeout=300)  # fmt: skip
    cluster.kubectl("create", "namespace", namespace)
    cluster.kubectl("wait", "--for=create", "serviceaccount/default", "-n", namespace)


def parse_time(value: str) -> float:
    """An API timestamp ("2026-11-22T10:00:00Z") as seconds since the epoch."""
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
