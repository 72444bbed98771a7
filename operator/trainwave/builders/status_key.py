"""The Secret that holds a job's status key, mounted into its workers. Pure.

The key is passed in (the controller derives it from its master key and the
job's UID, trainwave/signatures.py); this only shapes the object. Owned by the
job, so garbage collection removes it with the job.
"""

from typing import Any

from trainwave import contract, signatures
from trainwave.api.trainingjob import ObjectMeta
from trainwave.builders.names import status_key_secret
from trainwave.builders.owners import job_labels, owner_reference


def build_status_key_secret(job: ObjectMeta, key: bytes) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": status_key_secret(job.name, job.uid),
            "namespace": job.namespace,
            "labels": job_labels(job),
            "ownerReferences": [owner_reference(job)],
        },
        "type": "Opaque",
        # Never changed after creation: a rotated key would only be seen by pods
        # created afterwards, and the operator could not tell old from new.
        "immutable": True,
        "stringData": {contract.STATUS_KEY_FILE: signatures.key_to_text(key)},
    }
