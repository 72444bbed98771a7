"""A worker-container resource the user wrote and trainwave replaced: say so. Pure.

trainwave sets the worker container's `nvidia.com/gpu` (from gpusPerWorker), its
shared GPU memory (from gpuSharing) and its RDMA devices (from network.rdma)
itself: placement, Kueue's quota and the GPU pinning all count those fields, so
a different value in the template cannot be the one the worker gets. The job
runs with trainwave's value, and the user is told where they look: a
`ResourcesOverridden` condition (True) whose message names each field, the value
written and the value each worker gets, and one Warning Event whenever that
message changes (never on a resync). The condition turns False if the spec
comes to agree.

Why not refuse the job at the API server: a manifest ported from PyTorchJob
names its GPUs in the container's limits, since that is the only place
PyTorchJob has for them; a refusal would fail every such manifest at
`kubectl apply`, though trainwave knows exactly what to run. The same value
written twice is no news and reported nowhere.
"""

from collections.abc import Sequence

from trainwave.api.reasons import Reason
from trainwave.api.status import ConditionType
from trainwave.lifecycle.draft import Draft, JobEvent
from trainwave.resolving import ResourceOverride


def overridden(draft: Draft, overrides: Sequence[ResourceOverride]) -> None:
    previous = draft.status.condition(ConditionType.RESOURCES_OVERRIDDEN)
    if not overrides:
        if previous is not None and previous.status == "True":
            draft.clear(
                ConditionType.RESOURCES_OVERRIDDEN,
                Reason.RESOURCES_AS_WRITTEN,
                "the worker container's resources are used as written",
            )
        return
    message = "; ".join(o.describe() for o in overrides)
    draft.condition(ConditionType.RESOURCES_OVERRIDDEN, True, Reason.RESOURCES_OVERRIDDEN, message)
    if previous is None or previous.status != "True" or previous.message != message:
        draft.events.append(JobEvent("Warning", Reason.RESOURCES_OVERRIDDEN, message, lasting=True))
