"""The Kueue Workload of a queued TrainingJob: one pod set, the workers.

Pure. Kueue counts quota from the pod set's template exactly as it would from a
pod (requests, limits standing in for missing requests, init containers by
their maximum), so the template is cut from the worker pod trainwave would
build: whatever the gang will hold is what the quota is charged. Shared-GPU
workers hold `trainwave.io/gpu-memory` (MiB), so a ClusterQueue that covers that
resource counts them in GPU memory. The template's nodeSelector and tolerations
go along: Kueue matches them against each flavor's node labels and taints.
"""

import hashlib
from typing import Any

from trainwave import contract
from trainwave.builders.owners import job_labels, owner_reference
from trainwave.builders.pods import build_worker_pods
from trainwave.resolving import ResolvedJob

_NAME_LIMIT = 253  # a DNS subdomain; Workload names are not used as labels


def workload_name(name: str, uid: str) -> str:
    """`trainingjob-<name>-<5 hex>` as jobframework names Workloads (GetWorkloadNameForOwner);
    the hash of the uid keeps a recreated job of the same name from taking the old one's."""
    digest = hashlib.sha256(f"{name}/{uid}".encode()).hexdigest()[:5]
    prefix = f"{contract.SINGULAR}-{name}"[: _NAME_LIMIT - 6]
    return f"{prefix}-{digest}"


def build_workload(
    resolved: ResolvedJob, queue: str, runtime_image: str = contract.DEFAULT_RUNTIME_IMAGE
) -> dict[str, Any]:
    job = resolved.job
    meta = job.metadata
    pod = build_worker_pods(resolved, (0,), job.status.attempt, runtime_image)[0]
    spec = pod["spec"]
    template: dict[str, Any] = {
        "containers": [_slim(c) for c in spec["containers"]],
        "restartPolicy": "Never",
    }
    if spec.get("initContainers"):
        template["initContainers"] = [_slim(c) for c in spec["initContainers"]]
    for key in ("nodeSelector", "tolerations", "affinity"):
        if spec.get(key):
            template[key] = spec[key]
    return {
        "apiVersion": f"{contract.KUEUE_GROUP}/{contract.KUEUE_VERSION}",
        "kind": "Workload",
        "metadata": {
            "name": workload_name(meta.name, meta.uid),
            "namespace": meta.namespace,
            # kueue.x-k8s.io/job-uid: jobframework's label, used in Kueue's messages.
            "labels": {**job_labels(meta), "kueue.x-k8s.io/job-uid": meta.uid},
            "ownerReferences": [owner_reference(meta)],
        },
        "spec": {
            "queueName": queue,
            # Kueue preempts and orders by this number; trainwave's own placement
            # priority, so one number ranks a gang in both.
            "priority": job.spec.placement.priority,
            "podSets": [
                {
                    "name": contract.KUEUE_POD_SET,
                    "count": job.spec.workers,
                    "template": {"spec": template},
                }
            ],
        },
    }


def _slim(container: dict[str, Any]) -> dict[str, Any]:
    """Only what Kueue reads of a container: its name and resources (image is required)."""
    slim = {"name": container["name"], "image": container.get("image", "")}
    if container.get("resources"):
        slim["resources"] = container["resources"]
    return slim
