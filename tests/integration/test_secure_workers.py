"""Worker pods under Pod Security Admission, as the real API server enforces it.

What trainwave adds to a worker (the runtime's init container, its volumes) passes
"restricted"; what a feature needs beyond the enforced level is named on the job's
ReplicaFailure condition: RDMA's IPC_LOCK is outside baseline's capability list, so it
needs "privileged". Workers carry no API token unless their template names an account.
"""

from __future__ import annotations

from typing import Any

import pytest

from integration.trainwave_fixtures import (
    apply,
    condition,
    job,
    job_manifest,
    wait_until,
    worker_pods,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

# What "restricted" asks of the user's own pod and worker container: trainwave leaves
# these to the template (builders/security.py says why).
RESTRICTED_TEMPLATE = {
    "securityContext": {
        "runAsNonRoot": True,
        "runAsUser": 1000,
        "seccompProfile": {"type": "RuntimeDefault"},
    },
    "containers": [
        {
            "name": "worker",
            "securityContext": {
                "allowPrivilegeEscalation": False,
                "capabilities": {"drop": ["ALL"]},
            },
        }
    ],
}


def enforce(cluster, namespace: str, level: str) -> None:
    cluster.kubectl("label", "namespace", namespace, f"pod-security.kubernetes.io/enforce={level}")


def runtime_job(name: str, template: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    return job_manifest(name, run_for="120s", template_spec=template, runtime={}, **spec)


def created(cluster, namespace: str, name: str) -> list[dict[str, Any]]:
    return wait_until(lambda: worker_pods(cluster, namespace, name), 60, f"{name}'s workers")


def refused(cluster, namespace: str, name: str) -> str:
    def failing():
        found = condition(job(cluster, namespace, name), "ReplicaFailure")
        return found if found and found["status"] == "True" else None

    found = wait_until(failing, 60, f"a ReplicaFailure condition on {name}")
    assert found["reason"] == "FailedCreate"
    assert worker_pods(cluster, namespace, name) == []
    return str(found["message"])


def test_restricted_runs_the_runtime_and_names_what_needs_more(
    cluster, namespace, running_operator
):
    enforce(cluster, namespace, "restricted")
    apply(
        cluster,
        namespace,
        runtime_job("fits", RESTRICTED_TEMPLATE),
        runtime_job("rdma", RESTRICTED_TEMPLATE, network={"rdma": {}}),
        runtime_job("as-root"),
    )
    [pod] = created(cluster, namespace, "fits")
    [init] = pod["spec"]["initContainers"]
    assert init["securityContext"]["runAsNonRoot"] is True
    # No API token: the ServiceAccount admission plugin added no kube-api-access volume.
    assert pod["spec"]["automountServiceAccountToken"] is False
    assert not [v for v in pod["spec"]["volumes"] if v["name"].startswith("kube-api-access")]

    message = refused(cluster, namespace, "rdma")
    assert 'violates PodSecurity "restricted:latest"' in message, "the server's own words"
    assert (
        'Pod Security "restricted" refuses this job\'s features: network.rdma adds the '
        "IPC_LOCK capability (RDMA pins memory), which needs privileged" in message
    ), message

    message = refused(cluster, namespace, "as-root")
    assert "trainwave adds nothing this level refuses" in message, message
    assert '"trainwave-runtime"' not in message, "the init container passes restricted"


def test_baseline_runs_the_runtime_as_written_but_not_rdma(cluster, namespace, running_operator):
    enforce(cluster, namespace, "baseline")
    apply(cluster, namespace, runtime_job("plain"), runtime_job("rdma", network={"rdma": {}}))
    created(cluster, namespace, "plain")

    message = refused(cluster, namespace, "rdma")
    # IPC_LOCK is not in baseline's capability list (pod-security-admission's
    # check_capabilities_baseline.go), so baseline is not enough: privileged is.
    assert 'must not include "IPC_LOCK" in securityContext.capabilities.add' in message
    assert 'Pod Security "baseline" refuses this job\'s features: network.rdma' in message
    assert "needs privileged" in message, message


def test_a_template_that_names_an_account_gets_its_token(cluster, namespace, running_operator):
    cluster.kubectl("create", "serviceaccount", "trainer", "-n", namespace)
    apply(
        cluster, namespace, job_manifest("named", template_spec={"serviceAccountName": "trainer"})
    )
    [pod] = created(cluster, namespace, "named")
    assert "automountServiceAccountToken" not in pod["spec"]
    assert [v for v in pod["spec"]["volumes"] if v["name"].startswith("kube-api-access")]
