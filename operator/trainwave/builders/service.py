"""The headless Service that gives every worker a stable DNS name.

Pure. publishNotReadyAddresses: rank 0 must be resolvable before it is Ready,
because readiness comes only after the rendezvous that needs the name. The
reconciler creates it once every worker of the attempt has an address
(Decision.wants_service): the endpoint controllers then write its endpoints
once, instead of once per worker getting its address.
"""

from typing import Any

from trainwave import contract
from trainwave.api.trainingjob import TrainingJob
from trainwave.builders.names import service_name
from trainwave.builders.owners import job_labels, owner_reference


def build_service(job: TrainingJob) -> dict[str, Any]:
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
            },
            "ports": [
                {"name": contract.MASTER_PORT_NAME, "port": port, "targetPort": port},
            ],
        },
    }
