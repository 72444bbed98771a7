#!/usr/bin/env python3
"""Generate a Helm chart's values.schema.json from the comments in its values.yaml.

Usage:
    python hack/values_schema.py charts/trainwave/values.yaml > charts/trainwave/values.schema.json

values.yaml is the one source of truth for the chart's values (cert-manager does the same):
the schema only restates it, so `make check-generated` can catch drift.

The rules, in the order they apply to each key:

* Every key needs a helm-docs comment directly above it: `# -- text`, continued on the
  following `#` lines. The text becomes the `description`. A key without one is an error,
  because an undocumented value is one nobody can use safely.
* The JSON type is inferred from the default value (`""` -> string, `[]` -> array, ...).
* `# @schema <keyword>: <YAML value>` lines below the description add or override JSON
  Schema keywords where the default cannot say enough: `enum`, `minimum`, `pattern`, an
  explicit `type`, `items` of an empty list... `nullable: true` also admits null.
* A mapping with content is closed: its keys are described one by one and
  `additionalProperties: false` makes a misspelt key fail `helm install`. An empty mapping,
  or one annotated with `additionalProperties`, is free-form (resources, nodeSelector,
  affinity...): its content is an example handed to Kubernetes, so it is not descended into.

Only the standard library and PyYAML are used, so this runs before the project is installed.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

# Keywords an `@schema` line may set. A closed list turns a typo in an annotation into an
# error instead of a keyword every JSON Schema validator would silently ignore.
KEYWORDS = frozenset(
    {
        "type",
        "enum",
        "nullable",
        "items",
        "additionalProperties",
        "minimum",
        "maximum",
        "pattern",
        "minLength",
        "minItems",
    }
)

SCALAR_TYPES = {
    "tag:yaml.org,2002:str": "string",
    "tag:yaml.org,2002:int": "integer",
    "tag:yaml.org,2002:float": "number",
    "tag:yaml.org,2002:bool": "boolean",
}

DESCRIPTION_MARK = "--"
ANNOTATION_MARK = "@schema"


class SchemaError(Exception):
    """values.yaml breaks one of the rules above; the message says where and how to fix it."""


@dataclass(frozen=True)
class Source:
    """The file being read: its name for messages, its lines for the comments."""

    name: str
    lines: list[str]

    def where(self, node: Node, path: str) -> str:
        return f"{self.name}:{node.start_mark.line + 1}: {path or '<root>'}"


def comment_block(lines: list[str], line: int) -> list[str]:
    """The texts of the comment lines directly above `line` (0-based), top to bottom."""
    block: list[str] = []
    index = line - 1
    while index >= 0 and lines[index].lstrip().startswith("#"):
        block.insert(0, lines[index].lstrip()[1:].strip())
        index -= 1
    return block


def parse_comment(block: list[str], where: str) -> tuple[str, dict[str, Any]]:
    """Split a comment block into the description and the `@schema` keywords.

    Only the last `# --` paragraph counts, so a section heading above it may stay.
    """
    starts = [i for i, text in enumerate(block) if text.startswith(DESCRIPTION_MARK)]
    if not starts:
        raise SchemaError(
            f'{where}: no "# -- <description>" comment directly above this value; '
            "document it in values.yaml (helm-docs style) so the schema can describe it"
        )
    start = starts[-1]
    description = [block[start][len(DESCRIPTION_MARK) :].strip()]
    keywords: dict[str, Any] = {}
    for text in block[start + 1 :]:
        if not text.startswith(ANNOTATION_MARK):
            description.append(text)
            continue
        try:
            parsed = yaml.safe_load(text[len(ANNOTATION_MARK) :])
        except yaml.YAMLError as error:
            raise SchemaError(f"{where}: cannot parse {text!r} as YAML: {error}") from None
        if not isinstance(parsed, dict) or len(parsed) != 1:
            raise SchemaError(f"{where}: expected '# @schema <keyword>: <value>', got {text!r}")
        unknown = set(parsed) - KEYWORDS
        if unknown:
            raise SchemaError(
                f"{where}: unknown @schema keyword {sorted(unknown)[0]!r}; "
                f"accepted: {', '.join(sorted(KEYWORDS))}"
            )
        keywords.update(parsed)
    return " ".join(part for part in description if part), keywords


def infer_type(node: Node, where: str) -> str:
    if isinstance(node, MappingNode):
        return "object"
    if isinstance(node, SequenceNode):
        return "array"
    if node.tag in SCALAR_TYPES:
        return SCALAR_TYPES[node.tag]
    raise SchemaError(
        f"{where}: cannot infer a type from {node.value!r} (tag {node.tag}); "
        "add '# @schema type: <type>' and, if null is allowed, '# @schema nullable: true'"
    )


def infer_items(node: SequenceNode, where: str) -> dict[str, Any] | None:
    """An `items` schema when every element of the default list has the same type."""
    types = {infer_type(item, where) for item in node.value}
    return {"type": types.pop()} if len(types) == 1 else None


def describe(node: Node, source: Source, path: str, keywords: dict[str, Any]) -> dict[str, Any]:
    """The schema of one value, whose own comment has already been parsed into `keywords`."""
    where = source.where(node, path)
    # An explicit type wins, so a null default (e.g. "unset") can still be typed.
    schema: dict[str, Any] = {"type": keywords.get("type") or infer_type(node, where)}
    if isinstance(node, SequenceNode) and "items" not in keywords:
        items = infer_items(node, where)
        if items:
            schema["items"] = items
    free_form = keywords.get("additionalProperties", False) is not False
    if isinstance(node, MappingNode) and node.value and not free_form:
        schema["properties"] = describe_properties(node, source, path)
        schema["additionalProperties"] = False
    nullable = keywords.pop("nullable", False)
    schema.update(keywords)
    if nullable:
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        schema["type"] = [*types, "null"]
        if "enum" in schema:
            schema["enum"] = [*schema["enum"], None]
    if "enum" in schema and isinstance(node, ScalarNode):
        default = SafeConstructor().construct_object(node)
        if default not in schema["enum"]:
            raise SchemaError(f"{where}: default {default!r} is not in its enum {schema['enum']}")
    return schema


def describe_properties(node: MappingNode, source: Source, path: str) -> dict[str, Any]:
    properties: dict[str, Any] = {}
    for key_node, value_node in node.value:
        key = key_node.value
        child = f"{path}.{key}" if path else key
        block = comment_block(source.lines, key_node.start_mark.line)
        description, keywords = parse_comment(block, source.where(key_node, child))
        schema = describe(value_node, source, child, keywords)
        properties[key] = {"description": description, **schema}
    return properties


def generate(text: str, name: str = "values.yaml") -> dict[str, Any]:
    root = yaml.compose(text)
    if not isinstance(root, MappingNode):
        raise SchemaError(f"{name}: the document must be a mapping of values")
    schema = describe(root, Source(name, text.splitlines()), "", {})
    return {
        "$comment": "Generated by hack/values_schema.py from values.yaml. DO NOT EDIT.",
        "$schema": "http://json-schema.org/draft-07/schema#",
        **schema,
    }


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(f"usage: {argv[0]} path/to/values.yaml > values.schema.json", file=sys.stderr)
        return 2
    try:
        schema = generate(Path(argv[1]).read_text(encoding="utf-8"), argv[1])
    except SchemaError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except yaml.YAMLError as error:
        print(f"error: {argv[1]} is not valid YAML: {error}", file=sys.stderr)
        return 1
    sys.stdout.write(json.dumps(schema, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
