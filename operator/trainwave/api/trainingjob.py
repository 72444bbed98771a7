"""The TrainingJob object as the operator sees it, parsed once at the boundary.

Pure. `parse_trainingjob` turns the raw body the API server sent into frozen
models, or raises `InvalidSpec` with a message naming the field, the value seen
and what is accepted: the controller turns that into phase Failed, reason
InvalidSpec, and carries on.
"""

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from trainwave.api.base import cel
from trainwave.api.spec import TrainingJobSpec
from trainwave.api.status import TrainingJobStatus

# A worker's hostname is "<job>-worker-<rank>" and must be a DNS label (<= 63);
# with up to 10,000 workers the rank takes 4 digits, leaving 51 for the name.
MAX_NAME_LENGTH = 51

# (namespace, name) of a TrainingJob: how every cache, queue and map of the
# controller files a job. Defined here, the lowest layer its users share.
JobKey = tuple[str, str]

ROOT_VALIDATIONS = [
    cel(
        f"size(self.metadata.name) <= {MAX_NAME_LENGTH}",
        f"metadata.name must be at most {MAX_NAME_LENGTH} characters: worker hostnames "
        "'<name>-worker-<rank>' must fit in a 63-character DNS label",
    ),
    cel(
        "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",
        "metadata.name must be a DNS-1035 label (lowercase letters, digits and '-', starting "
        "with a letter): it names the job's headless Service",
    ),
]

PRINTER_COLUMNS = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Ready", "type": "string", "jsonPath": ".status.ready"},
    {"name": "Restarts", "type": "integer", "jsonPath": ".status.restarts"},
    {"name": "Disruptions", "type": "integer", "jsonPath": ".status.disruptions"},
    {"name": "GPUs", "type": "integer", "jsonPath": ".status.gpus"},
    {"name": "Progress", "type": "string", "jsonPath": ".status.progress.summary"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    {"name": "Reason", "type": "string", "jsonPath": ".status.reason", "priority": 1},
    {"name": "Attempt", "type": "integer", "jsonPath": ".status.attempt", "priority": 1},
    {"name": "Ignored", "type": "integer", "jsonPath": ".status.ignoredRestarts", "priority": 1},
    {"name": "Preempted", "type": "integer", "jsonPath": ".status.preemptions", "priority": 1},
    {"name": "Goodput", "type": "string", "jsonPath": ".status.goodput.summary", "priority": 1},
    {"name": "Message", "type": "string", "jsonPath": ".status.message", "priority": 1},
]


class InvalidSpec(ValueError):
    """The spec passed the API server's schema but cannot be run as written."""


class ObjectMeta(BaseModel):
    """The parts of metadata the operator uses; the rest is ignored."""

    model_config = ConfigDict(alias_generator=None, extra="ignore", frozen=True)

    name: str
    namespace: str
    uid: str
    generation: int = 0
    resourceVersion: str = ""  # noqa: N815 (the wire name)
    creationTimestamp: datetime | None = None  # noqa: N815
    deletionTimestamp: datetime | None = None  # noqa: N815
    labels: dict[str, str] = Field(default_factory=dict)


class TrainingJob(BaseModel):
    model_config = ConfigDict(frozen=True)

    metadata: ObjectMeta
    spec: TrainingJobSpec
    status: TrainingJobStatus


def parse_metadata(body: dict[str, Any]) -> ObjectMeta:
    return ObjectMeta.model_validate(body.get("metadata") or {})


def parse_status(body: dict[str, Any]) -> TrainingJobStatus:
    """Status is our own writing; a part we cannot read is dropped, not fatal."""
    try:
        return TrainingJobStatus.model_validate(body.get("status") or {})
    except ValidationError:
        return TrainingJobStatus()


def parse_spec(body: dict[str, Any]) -> TrainingJobSpec:
    """Raises InvalidSpec naming each field the schema let through but the model refuses."""
    try:
        return TrainingJobSpec.model_validate(body.get("spec") or {})
    except ValidationError as error:
        raise InvalidSpec(describe_errors(error)) from None


def parse_trainingjob(body: dict[str, Any]) -> TrainingJob:
    spec = parse_spec(body)
    return TrainingJob(metadata=parse_metadata(body), spec=spec, status=parse_status(body))


def describe_errors(error: ValidationError) -> str:
    """'spec.runPolicy.maxRestarts: Input should be ... (got -1)' for each problem."""
    parts = []
    for item in error.errors():
        path = "spec" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in item["loc"])
        seen = item.get("input")
        shown = "" if isinstance(seen, dict | list) else f" (got {seen!r})"
        parts.append(f"{path}: {item['msg']}{shown}")
    return "; ".join(parts)
