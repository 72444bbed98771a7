"""The TrainingJob CustomResourceDefinition, derived from the pydantic models.

Pure. pydantic speaks JSON Schema 2020-12; the API server wants a structural
OpenAPI v3 schema: no $ref, no null types, boolean exclusive bounds, and the
x-kubernetes-* extensions. `openapi_schema` translates one to the other and
`build_crd` wraps it with names, printer columns and the status subresource.
"""

from typing import Any

from trainwave import contract
from trainwave.api.spec import TrainingJobSpec
from trainwave.api.status import TrainingJobStatus
from trainwave.api.trainingjob import PRINTER_COLUMNS, ROOT_VALIDATIONS

# Keywords the API server accepts in a structural schema; pydantic's others
# (title, $defs, discriminator...) are dropped.
_KEPT = {
    "type",
    "format",
    "description",
    "default",
    "enum",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "pattern",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
    "required",
    "nullable",
}


def openapi_schema(model: type[Any]) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    return _convert(raw, raw.get("$defs", {}))


def _convert(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    node = _resolve(node, defs)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _KEPT or key.startswith("x-kubernetes-"):
            out[key] = value
        elif key == "properties":
            out[key] = {name: _convert(sub, defs) for name, sub in value.items()}
        elif key == "items" or (key == "additionalProperties" and isinstance(value, dict)):
            out[key] = _convert(value, defs)
        elif key == "anyOf" and node.get("x-kubernetes-int-or-string"):
            out[key] = value
        elif key == "const":
            out["enum"] = [value]
        elif key in ("exclusiveMinimum", "exclusiveMaximum"):
            bound = "minimum" if key == "exclusiveMinimum" else "maximum"
            out[bound] = value
            out[key] = True
    if "enum" in out and "type" not in out:
        out["type"] = _json_type(out["enum"][0])
    if (
        out.get("type") == "object"
        and "properties" not in out
        and "additionalProperties" not in out
    ):
        out.setdefault("x-kubernetes-preserve-unknown-fields", True)
    return out


def _resolve(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """Inline $ref and unwrap Optional (anyOf [X, null]); field-level keys win."""
    node = dict(node)
    if "$ref" in node:
        target = defs[node.pop("$ref").rsplit("/", 1)[-1]]
        node = {**_resolve(target, defs), **node}
    if "anyOf" in node and not node.get("x-kubernetes-int-or-string"):
        options = [o for o in node.pop("anyOf") if o.get("type") != "null"]
        if len(options) != 1:
            raise ValueError(f"cannot express a union of {options} in a structural schema")
        node = {**_resolve(options[0], defs), **node}
    if "allOf" in node:
        (only,) = node.pop("allOf")
        node = {**_resolve(only, defs), **node}
    if node.get("default") is None:
        node.pop("default", None)
    return node


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    return "string"


def trainingjob_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "description": "TrainingJob runs one distributed PyTorch training job as a gang of "
        "worker pods.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": openapi_schema(TrainingJobSpec),
            "status": openapi_schema(TrainingJobStatus),
        },
        "x-kubernetes-validations": ROOT_VALIDATIONS,
    }


def build_crd() -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{contract.PLURAL}.{contract.GROUP}"},
        "spec": {
            "group": contract.GROUP,
            "names": {
                "kind": contract.KIND,
                "listKind": f"{contract.KIND}List",
                "plural": contract.PLURAL,
                "singular": contract.SINGULAR,
                "shortNames": list(contract.SHORT_NAMES),
                "categories": ["all", "trainwave"],
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": contract.VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {"openAPIV3Schema": trainingjob_schema()},
                }
            ],
        },
    }
