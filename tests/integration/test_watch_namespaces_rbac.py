"""With `watchNamespaces`, the operator may read its jobs and EndpointSlices, change pods,
Services, EndpointSlices and Secrets and post Events only there, and watches only there.

The chart is reinstalled with one watched namespace and the real RBAC authorizer
answers for the operator's own token; the default install is restored afterwards,
since the rest of the session runs cluster-wide. The job is run by an operator
started with `--namespace`, as the chart starts it, under that RBAC: it may not
list TrainingJobs or EndpointSlices cluster-wide, so it runs the job only if it watches
the namespace through its namespaced endpoints.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster.controlplane import Cluster, tool
from cluster.deploy import NAMESPACE, OperatorProcess, install_chart, service_account_kubeconfig
from integration.trainwave_fixtures import (
    apply,
    get_json,
    job_manifest,
    wait_for_phase,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


@pytest.fixture
def watching(
    trainwave_installed: Cluster, namespace: str, running_operator: OperatorProcess
) -> Iterator[str]:
    """The chart installed with `namespace` as its only watched namespace.

    After `running_operator`: a session operator an earlier test left dead is restarted
    while the chart still grants it the whole cluster; restarted after the chart was
    narrowed, its cluster-wide lists would be refused and it would never report healthy
    (seen when test_watch_gap's operator stopped at load 10-14)."""
    install_chart(trainwave_installed, "--set-json", f'watchNamespaces=["{namespace}"]')
    yield namespace
    install_chart(trainwave_installed)


@pytest.fixture
def scoped_operator(
    cluster: Cluster, watching: str, running_operator: OperatorProcess, tmp_path: Path
) -> Iterator[OperatorProcess]:
    """An operator started as the chart starts it with `watching` alone: `--namespace`,
    the chart's ServiceAccount. The session operator (cluster-wide) is stopped
    meanwhile, so one operator acts; `running_operator` restarts it for later tests."""
    running_operator.stop()
    scoped = OperatorProcess(
        kubeconfig=service_account_kubeconfig(cluster, tmp_path / "scoped"),
        log_path=tmp_path / "scoped-operator.log",
        extra_args=("--namespace", watching),
    )
    scoped.start()
    yield scoped
    scoped.stop()


@pytest.fixture
def unwatched(cluster: Cluster) -> Iterator[str]:
    name = f"t-unwatched-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", name)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def create(kubeconfig: Path, namespace: str, manifest: dict) -> subprocess.CompletedProcess[str]:
    """Create with server-side dry run: authorization is decided, nothing is stored."""
    return subprocess.run(
        [str(tool("kubectl")), "create", "--dry-run=server", "-n", namespace, "-f", "-"],
        input=json.dumps(manifest), env=os.environ | {"KUBECONFIG": str(kubeconfig)},
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip


POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe"},
       "spec": {"containers": [{"name": "c", "image": "x"}]}}  # fmt: skip
SERVICE = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "probe"},
           "spec": {"clusterIP": "None", "ports": [{"port": 1}]}}  # fmt: skip
SECRET = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "probe"}}
SLICE = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
         "metadata": {"name": "probe"}, "addressType": "IPv4", "endpoints": []}  # fmt: skip


def test_the_operator_changes_only_watched_namespaces_and_still_runs_jobs_there(
    cluster: Cluster,
    watching: str,
    unwatched: str,
    scoped_operator: OperatorProcess,
    tmp_path: Path,
) -> None:
    operator = service_account_kubeconfig(cluster, tmp_path / "operator")
    for manifest in (POD, SERVICE, SLICE, SECRET):
        kind = manifest["kind"]
        allowed = create(operator, watching, manifest)
        assert allowed.returncode == 0, f"{kind} in the watched namespace: {allowed.stderr}"
        refused = create(operator, unwatched, manifest)
        assert refused.returncode != 0, f"{kind} in an unwatched namespace must be refused"
        assert "forbidden" in refused.stderr, refused.stderr
    # Events too: through the Role in each watched namespace, nowhere else (not even the
    # release's own namespace or `default`, where a Node's Events would go).
    for resource in ("events", "events.events.k8s.io"):
        for verb in ("create", "patch"):
            assert can_i(operator, verb, resource, watching) == "yes", (verb, resource)
            for elsewhere in (unwatched, NAMESPACE, "default"):
                assert can_i(operator, verb, resource, elsewhere) == "no", (
                    verb, resource, elsewhere,
                )  # fmt: skip
    # The master status key in the release namespace: still creatable on first start.
    assert create(operator, NAMESPACE, SECRET).returncode == 0
    # Placement still sees every pod (other workloads hold GPUs too) and every Node; its
    # jobs, their EndpointSlices, LimitRanges and ResourceQuotas it may read only where it
    # watches, so a cluster-wide LIST of them is refused.
    for resource in ("pods", "nodes"):
        assert can_i_everywhere(operator, "list", resource) == "yes", resource
    for resource in (
        "trainingjobs.trainwave.io",
        "endpointslices.discovery.k8s.io",
        "limitranges",
        "resourcequotas",
    ):
        assert can_i_everywhere(operator, "list", resource) == "no", resource
        assert can_i_everywhere(operator, "watch", resource) == "no", resource
        assert can_i(operator, "list", resource, watching) == "yes", resource
        assert can_i(operator, "list", resource, unwatched) == "no", resource

    apply(cluster, watching, job_manifest("scoped", workers=2))
    wait_for_phase(cluster, watching, "scoped", "Succeeded", timeout=90)
    assert scoped_operator.alive()
    log = scoped_operator.log_path.read_text(errors="replace")
    assert "forbidden" not in log.lower(), scoped_operator.tail()

    # Its Events were posted through the namespace's Role.
    def reasons() -> set[str]:
        events = get_json(cluster, watching, "events.events.k8s.io")["items"]
        return {e.get("reason") for e in events if e["regarding"].get("name") == "scoped"}

    wait_until(lambda: "Succeeded" in reasons(), 30, "the job's Succeeded Event")


def can_i_everywhere(kubeconfig: Path, verb: str, resource: str) -> str:
    return can_i(kubeconfig, verb, resource, "--all-namespaces")


def can_i(kubeconfig: Path, verb: str, resource: str, namespace: str) -> str:
    """The real authorizer's answer for the operator's own token: "yes" or "no"."""
    where = [namespace] if namespace == "--all-namespaces" else ["-n", namespace]
    answer = subprocess.run(
        [str(tool("kubectl")), "auth", "can-i", verb, resource, *where],
        env=os.environ | {"KUBECONFIG": str(kubeconfig)},
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    return answer.stdout.strip()
