"""A job's body read once per reconcile: the one parse everything after it uses.

The reconciler reads the job from the watch index (or the body its own last status
write returned, `bookkeeping.py`), parses it here once into a `JobRead`, and from
then on passes models: resolving, deciding, writing the status and the error net
never parse the body again. A status write moves the value on without a parse: the
status is the one just written, the metadata gets the new resourceVersion.
"""

from dataclasses import dataclass, replace
from typing import Any

from trainwave.api.spec import TrainingJobSpec
from trainwave.api.status import TrainingJobStatus
from trainwave.api.trainingjob import (
    InvalidSpec,
    ObjectMeta,
    TrainingJob,
    parse_metadata,
    parse_spec,
    parse_status,
)


@dataclass(frozen=True)
class JobRead:
    """The job as one reconcile sees it: the body and its three parts, parsed."""

    body: dict[str, Any]
    meta: ObjectMeta
    status: TrainingJobStatus  # as written
    spec: TrainingJobSpec | None  # None: the spec cannot be parsed, `invalid` says why
    invalid: str = ""

    def job(self, status: TrainingJobStatus | None = None) -> TrainingJob:
        """The parsed job, with `status` in place of the written one (a held status);
        raises InvalidSpec naming the field when the spec did not parse."""
        if self.spec is None:
            raise InvalidSpec(self.invalid)
        return TrainingJob(
            metadata=self.meta, spec=self.spec, status=self.status if status is None else status
        )

    def written(self, body: dict[str, Any], status: TrainingJobStatus) -> "JobRead":
        """This job once `status` is written and the API server answered with `body`."""
        version = str((body.get("metadata") or {}).get("resourceVersion", ""))
        meta = self.meta.model_copy(update={"resourceVersion": version})
        return replace(self, body=body, meta=meta, status=status)


def read_job(body: dict[str, Any]) -> JobRead:
    """The body parsed once; a spec the model refuses is kept as the reason, not raised:
    the job is then decided InvalidSpec, with the metadata and status it has."""
    meta, status = parse_metadata(body), parse_status(body)
    try:
        return JobRead(body, meta, status, parse_spec(body))
    except InvalidSpec as invalid:
        return JobRead(body, meta, status, None, str(invalid))
