"""A job's body read once per reconcile: the one parse everything after it uses.

The reconciler reads the job from the watch index (or the body its own last status
write returned, `bookkeeping.py`), parses it here once into a `JobRead`, and from
then on passes models: resolving, deciding, writing the status and the error net
never parse the body again. A status write moves the value on without a parse: the
status is the one just written, the metadata gets the new resourceVersion.

`kept_body` is what the operator keeps of a job between reconciles, in the job cache
and in the bookkeeping of its last status write alike.
"""

import sys
from collections.abc import Mapping
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


def kept_body(obj: Mapping[str, Any]) -> dict[str, Any]:
    """A job as the API sent it (a watch event, a status write's answer), as it is kept:
    metadata, spec and status, the parts `read_job` parses and Events name; not
    apiVersion/kind (always ours) nor metadata.managedFields (about half of a body's
    values, read by nothing). Every key and string is interned: each event decodes fresh
    copies of the same keys, condition types, reasons and node names, and 2,000 kept
    bodies held 2,000 copies of each. Equal to the parts it keeps, so nothing reads it
    differently."""
    body = {key: _interned(obj[key]) for key in ("metadata", "spec", "status") if key in obj}
    if isinstance(body.get("metadata"), dict):
        body["metadata"].pop("managedFields", None)
    return body


def _interned(value: Any) -> Any:
    if isinstance(value, str):
        return sys.intern(value)
    if isinstance(value, dict):
        return {sys.intern(str(k)): _interned(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_interned(v) for v in value]
    return value
