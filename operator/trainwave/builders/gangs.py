"""TrainingJob -> GangRequest: what the placement engine is asked for one job. Pure.

Shared by the operator and `trainwave plan`, so a dry run asks exactly what
the operator would.
"""

from collections.abc import Sequence

from trainwave.api.trainingjob import TrainingJob
from trainwave.builders.network import network_requirements
from trainwave.placement.gang import GangRequest
from trainwave.placement.ranks import Parallelism
from trainwave.placement.topology import HOSTNAME_LABEL


def gang_request(job: TrainingJob, levels: Sequence[str]) -> GangRequest:
    placement = job.spec.placement
    parallelism = None
    if placement.parallelism is not None:
        parallelism = Parallelism(
            tensor=placement.parallelism.tensor, pipeline=placement.parallelism.pipeline
        )
    # By default keep the gang in one domain of the level above hosts (a rack)
    # when one has room; a user may ask for another level or require one.
    preferred = placement.preferred_level
    configured = [level for level in levels if level != HOSTNAME_LABEL]
    if preferred is None and configured and placement.required_level is None:
        preferred = configured[-1]
    return GangRequest(
        name=job.metadata.name,
        workers=job.spec.workers,
        gpus_per_worker=job.spec.gpus_per_worker,
        required_level=placement.required_level,
        preferred_level=preferred,
        parallelism=parallelism,
        node_selector={
            **dict(job.spec.template.spec.get("nodeSelector") or {}),
            **network_requirements(job.spec.network),
        },
    )
