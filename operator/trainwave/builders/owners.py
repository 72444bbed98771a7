"""Labels and owner references every child of a job carries.

Pure.
"""

from typing import Any

from trainwave import contract
from trainwave.api.trainingjob import ObjectMeta


def job_labels(job: ObjectMeta) -> dict[str, str]:
    return {contract.LABEL_JOB_NAME: job.name}


def owner_reference(job: ObjectMeta) -> dict[str, Any]:
    return {
        "apiVersion": contract.API_VERSION,
        "kind": contract.KIND,
        "name": job.name,
        "uid": job.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }
