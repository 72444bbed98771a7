"""The headless Service that gives every worker a stable DNS name.

Pure. publishNotReadyAddresses: rank 0 must be resolvable before it is Ready,
because readiness comes only after the rendezvous that needs the name. The
reconciler creates it once every worker of the attempt has an address
(Decision.wants_service): the endpoint controllers then write its endpoints
once, instead of once per worker getting its address.

The selector names the attempt. Hostnames do not (`<job>-worker-<rank>` in every
attempt), and publishNotReadyAddresses keeps a terminating pod in the endpoints, so a
Service selecting every attempt's workers gave a new gang's rank 0 name the address of
the old gang's rank 0 while that pod was still terminating (a SIGSTOPped process holds
it for the whole grace period). In the fault benchmark the new gang's workers then waited
for a dead address and the gang was recreated twice more. When the attempt changes, the
reconciler applies the Service again at once, before the new gang's pods exist.
"""

from typing import Any

from trainwave import contract
from trainwave.api.trainingjob import TrainingJob
from trainwave.builders.names import service_name
from trainwave.builders.owners import job_labels, owner_reference


def build_service(job: TrainingJob, attempt: int) -> dict[str, Any]:
    port = job.spec.master_port
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": service_name(job.metadata.name),
            "namespace": job.metadata.namespace,
            "labels": job_labels(job.metadata),
            "ownerReferences": [owner_reference(job.metadata)],
        },
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {
                contract.LABEL_JOB_NAME: job.metadata.name,
                contract.LABEL_ROLE: contract.ROLE_WORKER,
                contract.LABEL_ATTEMPT: str(attempt),
            },
            "ports": [
                {"name": contract.MASTER_PORT_NAME, "port": port, "targetPort": port},
            ],
        },
    }
