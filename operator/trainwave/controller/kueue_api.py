"""Which version of Kueue's API the operator speaks, found once at start by discovery.

Kueue v0.11 to v0.14 serve kueue.x-k8s.io/v1beta1 only; v0.15 adds v1beta2, v0.16 stores
it, v0.17 marks v1beta1 deprecated, and Kueue plans to stop serving v1beta1 in v0.18
(Kueue's CHANGELOG/CHANGELOG-0.16.md). The operator takes the first version in
contract.KUEUE_VERSIONS that the API server serves (v1beta2 where it can: it is also
what kubectl and Kueue's own manager use there) and uses it for every read, watch and
write of Workloads and ResourceFlavors (controller/workloads.py).

The fields trainwave reads and writes have one shape in both versions (Kueue v0.17,
apis/kueue/v1beta1/zz_generated.conversion.go, autoConvert_v1beta1_WorkloadSpec_To_v1beta2_
WorkloadSpec and its siblings copy them as they are): spec.queueName, priority, active,
podSets[].name/count/template; status.conditions, admission.clusterQueue,
admission.podSetAssignments[].flavors; ResourceFlavor spec.nodeLabels and tolerations.
What differs (priorityClassSource/priorityClassName against priorityClassRef,
accumulatedPastExexcutionTimeSeconds, topology assignments, LocalQueue flavor usage)
trainwave neither writes nor reads, so no field is translated: only the apiVersion moves.

Why not v1beta1 everywhere, converted by Kueue's webhook: v1beta1 is on its way out, and
every call would then depend on the conversion webhook in Kueue's Deployment. Without it
(the CRDs installed alone, as tests/cluster/kueue.py does) a v0.17 API server refuses
v1beta1 status writes to a Workload: 422 "priorityClassSource is immutable".
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from kubernetes import client

from trainwave import contract
from trainwave.controller.kube import KubeClient

logger = logging.getLogger(__name__)


class KueueNotServed(RuntimeError):
    """The API server serves none of the Kueue versions trainwave speaks."""


def choose_version(served: Iterable[str]) -> str:
    """The first of contract.KUEUE_VERSIONS in `served` (the group's versions, as
    discovery lists them)."""
    served = list(served)
    for version in contract.KUEUE_VERSIONS:
        if version in served:
            return version
    found = ", ".join(served) if served else "none (Kueue's CRDs are not installed)"
    raise KueueNotServed(
        f"--kueue: the API server serves {contract.KUEUE_GROUP} versions {found}; trainwave "
        f"speaks {' or '.join(contract.KUEUE_VERSIONS)}. Install Kueue (v0.17 and v0.11 are "
        "tested) or run the operator without --kueue (Helm value kueue.enabled=false)."
    )


def discover_version(kube: KubeClient) -> str:
    """Ask the API server which versions of Kueue's group it serves, and choose one.
    Discovery is readable by every authenticated client (system:discovery): no RBAC."""
    groups = client.ApisApi(kube.custom.api_client).get_api_versions()
    served = [
        str(v.version)
        for group in groups.groups or []
        if group.name == contract.KUEUE_GROUP
        for v in group.versions or []
    ]
    version = choose_version(served)
    logger.info(
        "Kueue: Workloads and ResourceFlavors at %s/%s (served: %s)",
        contract.KUEUE_GROUP,
        version,
        ", ".join(served),
    )
    return version
