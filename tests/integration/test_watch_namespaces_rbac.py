"""With `watchNamespaces`, the operator may change pods, Services and Secrets only there.

The chart is reinstalled with one watched namespace and the real RBAC authorizer
answers for the operator's own token; the default install is restored afterwards,
since the rest of the session runs cluster-wide.
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
from cluster.deploy import NAMESPACE, install_chart, service_account_kubeconfig
from integration.trainwave_fixtures import apply, job_manifest, wait_for_phase

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


@pytest.fixture
def watching(trainwave_installed: Cluster, namespace: str) -> Iterator[str]:
    """The chart installed with `namespace` as its only watched namespace."""
    install_chart(trainwave_installed, "--set-json", f'watchNamespaces=["{namespace}"]')
    yield namespace
    install_chart(trainwave_installed)


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


def test_the_operator_changes_only_watched_namespaces_and_still_runs_jobs_there(
    cluster: Cluster, watching: str, unwatched: str, running_operator, tmp_path: Path
) -> None:
    operator = service_account_kubeconfig(cluster, tmp_path / "operator")
    for manifest in (POD, SERVICE, SECRET):
        kind = manifest["kind"]
        allowed = create(operator, watching, manifest)
        assert allowed.returncode == 0, f"{kind} in the watched namespace: {allowed.stderr}"
        refused = create(operator, unwatched, manifest)
        assert refused.returncode != 0, f"{kind} in an unwatched namespace must be refused"
        assert "forbidden" in refused.stderr, refused.stderr
    # The master status key in the release namespace: still creatable on first start.
    assert create(operator, NAMESPACE, SECRET).returncode == 0
    # Placement still sees every pod: other workloads hold GPUs too.
    listing = subprocess.run(
        [str(tool("kubectl")), "auth", "can-i", "list", "pods", "--all-namespaces"],
        env=os.environ | {"KUBECONFIG": str(operator)},
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert listing.stdout.strip() == "yes"

    apply(cluster, watching, job_manifest("scoped", workers=2))
    wait_for_phase(cluster, watching, "scoped", "Succeeded", timeout=90)
