"""Kueue's webhooks as its release manifests install them, pointed at a manager outside
the cluster: the API server calls them on loopback, as it calls a user's in-cluster Kueue
through its Service.

What the release manifests hold (Kueue v0.17.0, `kustomize build config/default`):
- config/components/webhook/manifests.yaml: one MutatingWebhookConfiguration and one
  ValidatingWebhookConfiguration with a webhook for each integration Kueue knows, enabled
  or not (a disabled integration's webhook answers "allowed", unchanged:
  pkg/util/webhook/noop_webhook.go), each with `failurePolicy: Fail`;
- config/components/webhook/kustomization.yaml: inline patches giving the pod, Deployment
  and StatefulSet webhooks a namespaceSelector that leaves out kube-system and kueue-system;
- config/components/crd/kustomization.yaml: patches/webhook_in_<plural>.yaml, the CRDs
  whose versions Kueue converts through its `/convert` endpoint;
- config/default/kustomization.yaml: the `kueue-` name prefix.

Only `clientConfig` differs from a real install: a URL on loopback and the CA of the
manager's self-signed pair, where the manifests name the `kueue-webhook-service` Service
and cert management fills in the bundle.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

NAME_PREFIX = "kueue-"  # config/default/kustomization.yaml


def admission_configurations(home: Path, base_url: str, ca_pem: bytes) -> list[dict[str, Any]]:
    """The Mutating- and ValidatingWebhookConfiguration, their webhooks calling `base_url`."""
    manifests = list(yaml.safe_load_all((home / "webhook" / "manifests.yaml").read_text()))
    kustomization = yaml.safe_load((home / "webhook" / "kustomization.yaml").read_text())
    patches = [
        yaml.safe_load(p["patch"]) for p in kustomization.get("patches") or () if "patch" in p
    ]
    bundle = base64.b64encode(ca_pem).decode()
    found = []
    for configuration in manifests:
        if not configuration:
            continue
        _merge_webhook_patches(configuration, patches)
        for webhook in configuration.get("webhooks") or ():
            path = webhook["clientConfig"]["service"]["path"]
            webhook["clientConfig"] = {"url": base_url + path, "caBundle": bundle}
        configuration["metadata"]["name"] = NAME_PREFIX + configuration["metadata"]["name"]
        found.append(configuration)
    return found


def converted_crds(home: Path) -> list[str]:
    """The CRDs (names) whose versions Kueue's release converts through its webhook."""
    kustomization = yaml.safe_load((home / "crd-kustomization.yaml").read_text())
    names = []
    for entry in kustomization.get("patches") or ():
        path = str(entry.get("path") or "")
        if not path.startswith("patches/webhook_in_"):
            continue
        patch = yaml.safe_load((home / "crd-patches" / Path(path).name).read_text())
        names.append(str(patch["metadata"]["name"]))
    return names


def conversion(base_url: str, ca_pem: bytes) -> dict[str, Any]:
    """A CRD's `spec.conversion` calling the manager's /convert, as patches/webhook_in_*.yaml."""
    return {
        "strategy": "Webhook",
        "webhook": {
            "clientConfig": {
                "url": base_url + "/convert",
                "caBundle": base64.b64encode(ca_pem).decode(),
            },
            "conversionReviewVersions": ["v1"],
        },
    }


def _merge_webhook_patches(
    configuration: dict[str, Any], patches: Iterable[Mapping[str, Any]]
) -> None:
    """kustomize's strategic merge of the inline patches: webhooks merged by name."""
    by_name = {w["name"]: w for w in configuration.get("webhooks") or ()}
    for patch in patches:
        if (
            patch.get("kind") != configuration.get("kind")
            or patch["metadata"]["name"] != configuration["metadata"]["name"]
        ):
            continue
        for change in patch.get("webhooks") or ():
            target = by_name.get(change["name"])
            if target is None:
                raise ValueError(
                    f"kustomization patch names webhook {change['name']!r}, not in the manifests"
                )
            target.update({k: v for k, v in change.items() if k != "name"})
