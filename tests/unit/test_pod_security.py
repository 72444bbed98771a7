"""Secure by default in the worker pod: no unasked-for API token, trainwave's own containers
under Pod Security "restricted", and refusals that name the feature and the level it needs."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from factories import make_job

from trainwave import contract
from trainwave.builders.pods import build_worker_pods
from trainwave.builders.security import RESTRICTED_CONTAINER
from trainwave.lifecycle.children import creating_failed
from trainwave.lifecycle.podsecurity import explain_refusal
from trainwave.resolving import resolve_job

pytestmark = pytest.mark.timeout(30)

# kube-apiserver 1.34.4's words, copied from the local control plane (a pod with
# hostNetwork, a worker adding IPC_LOCK and a runtime init container without a
# securityContext, dry-run created in namespaces enforcing each level).
BASELINE_REFUSAL = (
    'pods "demo-a0-worker-0" is forbidden: violates PodSecurity "baseline:latest": '
    'non-default capabilities (container "worker" must not include "IPC_LOCK" in '
    "securityContext.capabilities.add), host namespaces (hostNetwork=true), hostPort "
    '(container "worker" uses hostPort 29500)'
)
RESTRICTED_REFUSAL = (
    'pods "demo-a0-worker-0" is forbidden: violates PodSecurity "restricted:latest": '
    'allowPrivilegeEscalation != false (container "worker" must set '
    "securityContext.allowPrivilegeEscalation=false), runAsNonRoot != true (pod or container "
    '"worker" must set securityContext.runAsNonRoot=true)'
)


def pod_for(template: dict[str, Any] | None = None, **options: Any) -> dict[str, Any]:
    options.setdefault("command", ["torchrun", "train.py"])
    [pod] = build_worker_pods(
        resolve_job(make_job(workers=1, template=template, **options)), (0,), 0
    )
    return pod


@pytest.mark.parametrize(
    ("template_spec", "automount"),
    [
        ({}, False),
        ({"serviceAccountName": "trainer"}, None),
        ({"serviceAccount": "trainer"}, None),  # the deprecated alias names one too
        ({"automountServiceAccountToken": True}, True),
        ({"serviceAccountName": "trainer", "automountServiceAccountToken": False}, False),
    ],
    ids=["no-account", "named-account", "deprecated-alias", "template-true", "template-false"],
)
def test_workers_get_an_api_token_only_when_the_template_asks_for_one(
    template_spec: dict[str, Any], automount: bool | None
) -> None:
    pod = pod_for({"spec": template_spec})
    assert pod["spec"].get("automountServiceAccountToken") is automount


def test_the_runtime_init_container_runs_under_the_restricted_profile() -> None:
    pod = pod_for(runtime={})
    [init] = pod["spec"]["initContainers"]
    assert init["name"] == contract.RUNTIME_INIT_CONTAINER
    assert init["securityContext"] == RESTRICTED_CONTAINER
    assert init["securityContext"] is not RESTRICTED_CONTAINER  # later mutators may edit it


def test_the_users_worker_container_is_left_as_the_template_wrote_it() -> None:
    template = {"spec": {"containers": [{"name": "worker", "securityContext": {"runAsUser": 0}}]}}
    worker = pod_for(template, runtime={})["spec"]["containers"][0]
    assert worker["securityContext"] == {"runAsUser": 0}


@pytest.mark.parametrize(
    ("message", "network", "says", "never"),
    [
        (
            BASELINE_REFUSAL,
            {"rdma": {}, "hostNetwork": True},
            ['Pod Security "baseline"', "network.rdma adds the IPC_LOCK capability",
             "network.hostNetwork", "needs privileged"],
            [],
        ),
        (
            BASELINE_REFUSAL,
            {"rdma": {}},
            ["network.rdma adds the IPC_LOCK capability (RDMA pins memory), which needs "
             "privileged"],
            ["hostNetwork adds"],
        ),
        (
            RESTRICTED_REFUSAL,
            None,
            ['Pod Security "restricted": trainwave adds nothing this level refuses',
             "spec.template"],
            ["network."],
        ),
    ],
    ids=["baseline-rdma-and-host-network", "baseline-rdma", "restricted-template-only"],
)  # fmt: skip
def test_a_pod_security_refusal_names_the_feature_and_the_level_it_needs(
    message: str, network: dict[str, Any] | None, says: list[str], never: list[str]
) -> None:
    job = make_job(workers=1, network=network)
    explanation = explain_refusal(message, job.spec.network)
    for words in says:
        assert words in explanation, explanation
    for words in never:
        assert words not in explanation, explanation


def test_other_refusals_get_no_pod_security_explanation() -> None:
    job = make_job(workers=1, network={"rdma": {}})
    assert explain_refusal("exceeded quota: q, requested: pods=1", job.spec.network) == ""


def test_the_explanation_leads_the_condition_so_the_event_keeps_it() -> None:
    job = make_job(workers=1, network={"rdma": {}})
    now = datetime(2026, 1, 1, tzinfo=UTC)
    explanation = explain_refusal(BASELINE_REFUSAL, job.spec.network)
    failed = creating_failed(
        job.metadata,
        job.status,
        "pod ns/demo-a0-worker-0",
        BASELINE_REFUSAL,
        now,
        explanation=explanation,
    )
    message = failed.status.message or ""
    assert message.startswith(f"creating pod ns/demo-a0-worker-0 failed: {explanation}")
    assert message.endswith(BASELINE_REFUSAL)
    assert explanation in failed.events[0].message
