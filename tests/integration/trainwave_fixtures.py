"""Fixtures and helpers for tests that run the trainwave operator on the local cluster.

The chart is installed once per session and the operator runs as a local
process with the chart's ServiceAccount token; tests that kill it start it
again through the same fixture object.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import yaml

from cluster.controlplane import Cluster
from cluster.deploy import (
    LEASE,
    NAMESPACE,
    OperatorProcess,
    free_port,
    install_chart,
    service_account_kubeconfig,
)

TERMINAL = ("Succeeded", "Failed")


@contextmanager
def operator_restarted_with(running: OperatorProcess, *args: str) -> Iterator[OperatorProcess]:
    """The session operator stopped and started again with `args` added (same pod name, so
    it takes the Lease back at once), then restored as it was."""
    running.stop()
    changed = dataclasses.replace(
        running,
        process=None,
        metrics_port=free_port(),
        health_port=free_port(),
        extra_args=(*running.extra_args, *args),
    )
    changed.start()
    try:
        yield changed
    finally:
        changed.stop()
        running.start()


# The session operator reads a worker's /status every 2 s, not every 15 s (the flag's
# default): the tests that serve a worker's /status (goodput, stragglers, hangs,
# preflight, trust) wait for the operator's next poll, up to a whole interval each time.
# Only workers on 127.0.0.0/8 are read (`--status-networks`), so the other tests' jobs
# cost no reads.
STATUS_INTERVAL_SECONDS = 2


@pytest.fixture(scope="session")
def trainwave_installed(cluster: Cluster) -> Cluster:
    install_chart(cluster)
    return cluster


@pytest.fixture(scope="session")
def operator(
    trainwave_installed: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    workdir = tmp_path_factory.mktemp("operator")
    kubeconfig = service_account_kubeconfig(trainwave_installed, workdir / "kubeconfig")
    process = OperatorProcess(
        kubeconfig=kubeconfig,
        log_path=workdir / "operator.log",
        extra_args=("--status-interval-seconds", str(STATUS_INTERVAL_SECONDS)),
    )
    process.start()
    yield process
    process.stop()


@pytest.fixture
def running_operator(operator: OperatorProcess) -> OperatorProcess:
    """The session operator, restarted first if an earlier test left it dead."""
    if not operator.alive():
        operator.start()
    return operator


def lease_holder(cluster: Cluster) -> str:
    """The pod name of the operator replica holding the leader Lease ('' when none does)."""
    identity = cluster.kubectl(
        "get", "lease", LEASE, "-n", NAMESPACE, "-o", "jsonpath={.spec.holderIdentity}"
    ).stdout.strip()
    return identity.rpartition("_")[0]  # identities are <pod name>_<random suffix>


def job_manifest(
    name: str,
    *,
    workers: int = 1,
    gpus: int = 1,
    result: str | None = "Succeeded",
    run_for: str = "1s",
    exit_code: int | None = None,
    run_policy: dict[str, Any] | None = None,
    template_spec: dict[str, Any] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    annotations = {}
    if result:
        annotations["sim.trainwave.io/result"] = result
        annotations["sim.trainwave.io/run-for"] = run_for
    if exit_code is not None:
        annotations["sim.trainwave.io/exit-code"] = str(exit_code)
    return {
        "apiVersion": "trainwave.io/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name},
        "spec": {
            "workers": workers,
            "gpusPerWorker": gpus,
            "image": "trainwave/test-worker:1",
            "command": ["python", "train.py"],
            "runPolicy": run_policy or {},
            "template": {"metadata": {"annotations": annotations}, "spec": template_spec or {}},
            **spec,
        },
    }


def apply(cluster: Cluster, namespace: str, *manifests: dict[str, Any]) -> None:
    documents = yaml.safe_dump_all(manifests)
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=documents)


def get_json(cluster: Cluster, namespace: str, *args: str) -> Any:
    return json.loads(cluster.kubectl("get", "-n", namespace, "-o", "json", *args).stdout)


def job(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = get_json(cluster, namespace, "trainingjob", name)
    return found


def jobs_by_name(cluster: Cluster, namespace: str) -> dict[str, dict[str, Any]]:
    """Every TrainingJob in `namespace` by name, in ONE list call: a poll over 20 jobs
    costs one kubectl, not 20 (about 0.1 s of CPU each on this machine)."""
    items: list[dict[str, Any]] = get_json(cluster, namespace, "trainingjobs")["items"]
    return {item["metadata"]["name"]: item for item in items}


def worker_pods(cluster: Cluster, namespace: str, name: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = get_json(
        cluster, namespace, "pods", "-l", f"trainwave.io/job-name={name}"
    )["items"]
    return items


def events_about(
    cluster: Cluster,
    namespace: str,
    predicate: Callable[[dict[str, Any]], bool],
    what: str,
    timeout: float = 15,
) -> list[dict[str, Any]]:
    """The events.k8s.io Events in `namespace` that match, once there is one: the
    operator posts Events in the background, a moment after the status they go with."""

    def found() -> list[dict[str, Any]]:
        items = get_json(cluster, namespace, "events.events.k8s.io")["items"]
        return [e for e in items if predicate(e)]

    matched: list[dict[str, Any]] = wait_until(found, timeout, what)
    return matched


def wait_until(check: Callable[[], Any], timeout: float, what: str, interval: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last seen: {last!r}")


def wait_for_phase(
    cluster: Cluster, namespace: str, name: str, phases: tuple[str, ...] | str, timeout: float = 90
) -> dict[str, Any]:
    wanted = (phases,) if isinstance(phases, str) else phases

    def reached() -> dict[str, Any] | None:
        body = job(cluster, namespace, name)
        return body if body.get("status", {}).get("phase") in wanted else None

    try:
        found: dict[str, Any] = wait_until(reached, timeout, f"{name} in {wanted}")
    except AssertionError:
        status = job(cluster, namespace, name).get("status")
        raise AssertionError(f"{name} never reached {wanted}; status: {status}") from None
    return found


def condition(body: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next(
        (c for c in body.get("status", {}).get("conditions", []) if c["type"] == kind), None
    )


def env_of(pod: dict[str, Any]) -> dict[str, str]:
    worker = next(c for c in pod["spec"]["containers"] if c["name"] == "worker")
    return {e["name"]: e.get("value", "") for e in worker.get("env", [])}


def placed_at_creation(operator: OperatorProcess) -> float:
    """Gangs the operator created pinned, with no gate and no release patch after (its
    pods are created, so their managedFields cannot tell a create from a create and a
    release: both are trainwave's Update)."""
    text = operator.metrics()
    found = re.search(r"^trainwave_gangs_placed_at_creation_total (\S+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def dry_runs(operator: OperatorProcess, result: str) -> float:
    found = re.search(
        rf'^trainwave_creation_dry_runs_total{{result="{result}"}} (\S+)$', operator.metrics(), re.M
    )
    return float(found.group(1)) if found else 0.0


def nothing_waits(cluster: Cluster) -> bool:
    """No gang anywhere waits for placement: a new gang is placed at creation only then
    (an earlier test's jobs may still be queued while their namespace goes away)."""
    listed = cluster.kubectl("get", "pods", "-A", "-l", "trainwave.io/role=worker", "-o", "json")
    if any(_gated(pod) for pod in json.loads(listed.stdout)["items"]):
        return False
    listed = cluster.kubectl("get", "trainingjobs", "-A", "-o", "json")
    phases = [(j.get("status") or {}).get("phase") for j in json.loads(listed.stdout)["items"]]
    return not any(phase in ("Pending", "Scheduling") for phase in phases)


def _gated(pod: dict[str, Any]) -> bool:
    gates = pod["spec"].get("schedulingGates") or ()
    return any(g["name"] == "trainwave.io/placement" for g in gates)
