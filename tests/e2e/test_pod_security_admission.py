"""Pod Security Admission on the real node: what runs where, at which level.

- A job with `spec.runtime` runs in a namespace that enforces `restricted`: the runtime's
  init container carries the restricted settings itself (builders/security.py); the
  user's own worker container is the template's to make compliant (as the job below
  does), and then the whole pod is admitted, started by the real kubelet and succeeds.
- The release namespace is labelled `privileged`, as docs/operations/install.md asks:
  the agent reads the host's /sys and /proc through hostPath volumes, and with
  `agent.gpuClaims` its kubelet plugin runs as root (the kubelet's plugin directories
  are root's), which neither `baseline` nor `restricted` allow. The operator's pods pass
  `restricted`. The API server's own judgement is asked: a server-side dry run of
  relabelling the namespace lists the pods the new level would refuse.
"""

from __future__ import annotations

from typing import Any

import pytest

from cluster.controlplane import Cluster
from e2e.conftest import ON_REAL_NODE, RELEASE_NAMESPACE_LEVEL, WORKER_IMAGE, Release
from integration.trainwave_fixtures import apply, job_manifest, wait_for_phase, worker_pods
from trainwave import contract

pytestmark = pytest.mark.timeout(240)

UID = 65532
# What "restricted" asks of the user's pod and worker container (the template's part).
RESTRICTED_TEMPLATE: dict[str, Any] = {
    "nodeSelector": ON_REAL_NODE,
    "securityContext": {
        "runAsNonRoot": True,
        "runAsUser": UID,
        "runAsGroup": UID,
        "seccompProfile": {"type": "RuntimeDefault"},
    },
    "containers": [
        {
            "name": contract.WORKER_CONTAINER,
            "securityContext": {
                "allowPrivilegeEscalation": False,
                "capabilities": {"drop": ["ALL"]},
            },
        }
    ],
}
SCRIPT = "import os, trainwave.runtime; print('worker uid', os.getuid(), flush=True)"


def violations(cluster: Cluster, namespace: str, level: str) -> dict[str, str]:
    """The pods the API server would refuse if `namespace` enforced `level`, with its
    reasons: the warnings of a server-side dry run of the relabelling."""
    result = cluster.kubectl(
        "label", "namespace", namespace, "--overwrite", "--dry-run=server",
        f"pod-security.kubernetes.io/enforce={level}",
    )  # fmt: skip
    found = {}
    for line in result.stderr.splitlines():
        # "Warning: <pod>: <check>, <check>"; the first warning names the namespace only.
        pod, colon, reasons = line.removeprefix("Warning: ").partition(": ")
        if colon and " " not in pod:
            found[pod] = reasons
    return found


def test_runtime_job_runs_in_a_restricted_namespace(release: Release, namespace: str) -> None:
    cluster = release.cluster
    for mode in ("enforce", "warn"):
        cluster.kubectl("label", "namespace", namespace,
                        f"pod-security.kubernetes.io/{mode}=restricted")  # fmt: skip
    manifest = job_manifest(
        "restricted",
        result=None,
        image=WORKER_IMAGE,
        command=["python", "-c", SCRIPT],
        runtime={},
        template_spec=RESTRICTED_TEMPLATE,
    )
    apply(cluster, namespace, manifest)

    done = wait_for_phase(cluster, namespace, "restricted", ("Succeeded", "Failed"), timeout=180)

    assert done["status"]["phase"] == "Succeeded", done["status"]
    (pod,) = worker_pods(cluster, namespace, "restricted")
    assert pod["spec"]["nodeName"] == release.node
    name = pod["metadata"]["name"]
    installed = cluster.kubectl(
        "logs", name, "-n", namespace, "-c", contract.RUNTIME_INIT_CONTAINER
    ).stdout
    assert "trainwave runtime installed" in installed
    worker = cluster.kubectl("logs", name, "-n", namespace, "-c", contract.WORKER_CONTAINER)
    assert f"worker uid {UID}" in worker.stdout, worker.stdout[-2000:]
    # Nothing in the namespace would be refused at the level it enforces.
    assert violations(cluster, namespace, "restricted") == {}


def test_operator_passes_restricted_and_the_agent_needs_privileged(release: Release) -> None:
    cluster, namespace = release.cluster, release.namespace
    labels = cluster.kubectl(
        "get", "namespace", namespace, "-o", "jsonpath={.metadata.labels}"
    ).stdout
    assert f'"pod-security.kubernetes.io/enforce":"{RELEASE_NAMESPACE_LEVEL}"' in labels
    operators = [p["metadata"]["name"] for p in release.operator_pods()]
    agent = release.agent_pod()["metadata"]["name"]

    restricted = violations(cluster, namespace, "restricted")
    baseline = violations(cluster, namespace, "baseline")

    assert set(restricted) == {agent}, restricted  # not the operator pods
    assert not set(operators) & set(restricted)
    # Below privileged the agent is refused for its host mounts.
    assert set(baseline) == {agent}, baseline
    assert "hostPath volumes" in baseline[agent], baseline
    assert violations(cluster, namespace, "privileged") == {}
