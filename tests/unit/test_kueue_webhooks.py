"""Kueue's webhooks rendered from its release manifests for a manager on loopback
(tests/cluster/kueue_webhooks.py): the files' shapes as Kueue v0.17.0 ships them, cut down."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
import yaml

from cluster import kueue_webhooks

MANIFESTS = """---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata:
  name: mutating-webhook-configuration
webhooks:
- admissionReviewVersions: [v1]
  clientConfig:
    service: {name: webhook-service, namespace: system, path: /mutate--v1-pod}
  failurePolicy: Fail
  name: mpod.kb.io
  rules:
  - {apiGroups: [""], apiVersions: [v1], operations: [CREATE], resources: [pods]}
  sideEffects: None
- admissionReviewVersions: [v1]
  clientConfig:
    service: {name: webhook-service, namespace: system, path: /mutate-batch-v1-job}
  failurePolicy: Fail
  name: mjob.kb.io
  rules:
  - {apiGroups: [batch], apiVersions: [v1], operations: [CREATE], resources: [jobs]}
  sideEffects: None
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata:
  name: validating-webhook-configuration
webhooks:
- admissionReviewVersions: [v1]
  clientConfig:
    service: {name: webhook-service, namespace: system, path: /validate--v1-pod}
  failurePolicy: Fail
  name: vpod.kb.io
  rules:
  - {apiGroups: [""], apiVersions: [v1], operations: [CREATE, UPDATE], resources: [pods]}
  sideEffects: None
"""

KUSTOMIZATION = """resources: [manifests.yaml, service.yaml]
patches:
- patch: |-
    apiVersion: admissionregistration.k8s.io/v1
    kind: MutatingWebhookConfiguration
    metadata:
      name: mutating-webhook-configuration
    webhooks:
    - name: mpod.kb.io
      namespaceSelector:
        matchExpressions:
        - {key: kubernetes.io/metadata.name, operator: NotIn, values: [kube-system, kueue-system]}
"""

CRD_KUSTOMIZATION = """resources: [bases/kueue.x-k8s.io_workloads.yaml]
patches:
- path: patches/webhook_in_workloads.yaml
#- path: patches/webhook_in_resourceflavors.yaml
"""

WORKLOAD_PATCH = """apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: workloads.kueue.x-k8s.io
spec:
  conversion:
    strategy: Webhook
"""


@pytest.fixture
def home(tmp_path: Path) -> Path:
    (tmp_path / "webhook").mkdir()
    (tmp_path / "webhook" / "manifests.yaml").write_text(MANIFESTS)
    (tmp_path / "webhook" / "kustomization.yaml").write_text(KUSTOMIZATION)
    (tmp_path / "crd-patches").mkdir()
    (tmp_path / "crd-patches" / "webhook_in_workloads.yaml").write_text(WORKLOAD_PATCH)
    (tmp_path / "crd-patches" / "webhook_in_resourceflavors.yaml").write_text(WORKLOAD_PATCH)
    (tmp_path / "crd-kustomization.yaml").write_text(CRD_KUSTOMIZATION)
    return tmp_path


def test_each_webhook_calls_the_manager_by_url_with_the_ca_and_keeps_the_rest(home: Path) -> None:
    mutating, validating = kueue_webhooks.admission_configurations(
        home, "https://127.0.0.1:9443", b"PEM"
    )
    assert mutating["metadata"]["name"] == "kueue-mutating-webhook-configuration"
    assert validating["metadata"]["name"] == "kueue-validating-webhook-configuration"
    pod, job = mutating["webhooks"]
    assert pod["clientConfig"] == {
        "url": "https://127.0.0.1:9443/mutate--v1-pod",
        "caBundle": base64.b64encode(b"PEM").decode(),
    }
    assert job["clientConfig"]["url"] == "https://127.0.0.1:9443/mutate-batch-v1-job"
    assert pod["failurePolicy"] == "Fail"
    assert pod["rules"] == next(yaml.safe_load_all(MANIFESTS))["webhooks"][0]["rules"]


def test_the_kustomization_patches_merge_into_the_webhooks_they_name(home: Path) -> None:
    mutating, validating = kueue_webhooks.admission_configurations(home, "https://h", b"")
    pod, job = mutating["webhooks"]
    assert pod["namespaceSelector"]["matchExpressions"][0]["values"] == [
        "kube-system",
        "kueue-system",
    ]
    assert "namespaceSelector" not in job
    assert "namespaceSelector" not in validating["webhooks"][0], "the patch names the mutating one"


def test_a_patch_for_a_webhook_the_manifests_lack_is_an_error(home: Path) -> None:
    path = home / "webhook" / "kustomization.yaml"
    path.write_text(KUSTOMIZATION.replace("name: mpod.kb.io", "name: mgone.kb.io"))
    with pytest.raises(ValueError, match=r"mgone\.kb\.io"):
        kueue_webhooks.admission_configurations(home, "https://h", b"")


def test_only_the_crds_whose_conversion_patch_is_listed_are_converted(home: Path) -> None:
    assert kueue_webhooks.converted_crds(home) == ["workloads.kueue.x-k8s.io"]
    conversion = kueue_webhooks.conversion("https://h:1", b"CA")
    assert conversion["webhook"]["clientConfig"]["url"] == "https://h:1/convert"
    assert conversion["strategy"] == "Webhook"
