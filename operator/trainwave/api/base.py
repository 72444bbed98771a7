"""Building blocks shared by the TrainingJob models.

Pure. The models are the one source of truth for the CRD: field descriptions
become the OpenAPI descriptions users read in `kubectl explain`, and CEL rules
declared here are what the API server enforces.
"""

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, WithJsonSchema
from pydantic.alias_generators import to_camel

# Kubernetes resource quantities ("8", "16Gi", 4): the API server checks the
# syntax on the pod; here they are kept verbatim.
QUANTITY_PATTERN = r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"  # noqa: E501
Quantity = Annotated[
    int | str,
    WithJsonSchema(
        {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "x-kubernetes-int-or-string": True,
            "pattern": QUANTITY_PATTERN,
        }
    ),
]

# A free-form object the API server stores as given (pod spec fragments).
OpenObject = Annotated[
    dict[str, Any],
    WithJsonSchema({"type": "object", "x-kubernetes-preserve-unknown-fields": True}),
]


def cel(rule: str, message: str, field_path: str | None = None) -> dict[str, str]:
    """One `x-kubernetes-validations` entry; messages name the field and what is accepted."""
    entry = {"rule": rule, "message": message}
    if field_path:
        entry["fieldPath"] = field_path
    return entry


def validations(*rules: dict[str, str]) -> dict[str, Any]:
    return {"x-kubernetes-validations": list(rules)}


class ApiModel(BaseModel):
    """camelCase on the wire, snake_case in Python, unknown fields refused.

    The API server already prunes or rejects unknown fields; refusing them here
    too means a CRD that drifted from these models fails loudly in tests.
    """

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
    )
