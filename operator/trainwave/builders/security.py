"""What trainwave adds to a worker pod runs under Pod Security "restricted". Pure.

Pod Security Admission judges the whole pod, so one container trainwave adds
without a securityContext makes every job with it fail in a namespace that
enforces "restricted". Two rules:
- containers trainwave adds (the runtime's init container) carry the
  restricted profile's container settings themselves (`RESTRICTED_CONTAINER`);
- worker pods do not carry an API credential they never use: the namespace's
  default ServiceAccount token is only mounted when the template names a
  ServiceAccount (or sets `automountServiceAccountToken` itself).

The user's own worker container is left as the template wrote it: running a
user's image as non-root or without capabilities could break it, and the
job's own settings are the user's to choose. Features that need more than
"restricted" say so (lifecycle/podsecurity.py).
"""

import copy
from typing import Any

from trainwave.builders.worker import Worker

# The runtime image runs as this numeric user (images/runtime.Dockerfile); a number
# lets the kubelet verify runAsNonRoot, and forces a non-root user on a custom
# `spec.runtime.image` too (the installer writes only into its emptyDir, which is
# world-writable).
RUNTIME_USER = 65532

# Each field is one check of the "restricted" profile (Kubernetes' Pod Security
# Standards, pod-security-admission's policy/check_*.go): allowPrivilegeEscalation,
# capabilities (drop ALL), runAsNonRoot, seccompProfile. readOnlyRootFilesystem is
# not required; the installer writes nothing outside its volume, so it costs nothing.
RESTRICTED_CONTAINER: dict[str, Any] = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "runAsNonRoot": True,
    "runAsUser": RUNTIME_USER,
    "runAsGroup": RUNTIME_USER,
    "readOnlyRootFilesystem": True,
    "seccompProfile": {"type": "RuntimeDefault"},
}


def set_service_account_token(pod: dict[str, Any], worker: Worker) -> None:
    """No API token in the workers unless the template asks for an identity.

    Without this, the ServiceAccount admission plugin mounts the namespace's
    `default` token into every worker: code the job author runs (and any
    dependency it pulls) gets an API credential nobody granted it on purpose.
    """
    spec = pod["spec"]
    if "automountServiceAccountToken" in spec:
        return  # the template decided
    if spec.get("serviceAccountName") or spec.get("serviceAccount"):
        return  # a named identity is asked for: its token is the point
    spec["automountServiceAccountToken"] = False


def restricted_container() -> dict[str, Any]:
    """A fresh copy of `RESTRICTED_CONTAINER` (manifests are mutated by later steps)."""
    return copy.deepcopy(RESTRICTED_CONTAINER)
