"""The API boundary: parsing TrainingJob bodies, and the CRD the models generate."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import pytest
import yaml
from factories import make_body, make_job, rule
from pydantic import BaseModel, Field

from trainwave import contract
from trainwave.api.crd import build_crd, openapi_schema
from trainwave.api.generate import render_chart_crd, render_crd
from trainwave.api.spec import IMMUTABLE_WHILE_RUNNING
from trainwave.api.status import Phase
from trainwave.api.trainingjob import InvalidSpec, parse_trainingjob

pytestmark = pytest.mark.timeout(10)

ROOT = Path(__file__).resolve().parents[2]
CRD_FILE = ROOT / "crds" / f"{contract.PLURAL}.{contract.GROUP}.yaml"
CHART_CRD_FILE = ROOT / "charts" / "trainwave" / "templates" / "crds" / f"{contract.PLURAL}.yaml"


# --- parsing ------------------------------------------------------------------------------


def test_defaults_fill_what_the_user_left_out() -> None:
    body = make_body()
    body["spec"] = {"workers": 3, "image": "train:1"}
    job = parse_trainingjob(body)
    spec = job.spec
    assert (spec.processes_per_worker, spec.gpus_per_worker) == (1, 0)
    assert spec.master_port == contract.DEFAULT_MASTER_PORT
    assert (spec.command, spec.args, spec.env) == ([], [], [])
    assert spec.template.spec == {}
    policy = spec.run_policy
    assert policy.failure_policy.max_restarts == 3
    assert policy.failure_policy.rules == []
    assert policy.success_policy == "AllWorkers"
    assert policy.active_deadline_seconds is None
    assert policy.ttl_seconds_after_finished is None
    assert policy.suspend is False


def test_camel_case_fields_reach_snake_case_attributes() -> None:
    job = make_job(
        workers=4,
        gpus_per_worker=8,
        processes_per_worker=8,
        max_restarts=5,
        rules=(rule("Ignore", "In", 137),),
        success_policy="Rank0",
        active_deadline_seconds=600,
        ttl=60,
        imagePullPolicy="IfNotPresent",
        masterPort=23456,
    )
    spec = job.spec
    assert (spec.workers, spec.gpus_per_worker, spec.processes_per_worker) == (4, 8, 8)
    assert (spec.total_gpus, spec.world_size) == (32, 32)
    assert spec.image_pull_policy == "IfNotPresent"
    assert spec.master_port == 23456
    policy = spec.run_policy
    assert policy.failure_policy.max_restarts == 5
    assert policy.failure_policy.rules[0].on_exit_codes.values == [137]
    assert (policy.success_policy, policy.active_deadline_seconds) == ("Rank0", 600)
    assert policy.ttl_seconds_after_finished == 60
    assert job.metadata.namespace == "team-a"
    assert job.metadata.uid == "uid-1"


def test_status_is_parsed_with_camel_case() -> None:
    job = make_job(phase="Running", attempt=2, restarts=1)
    assert job.status.phase is Phase.RUNNING
    assert (job.status.attempt, job.status.restarts) == (2, 1)


def test_unreadable_status_is_dropped_not_fatal() -> None:
    body = make_body(phase="Running", attempt=4)
    body["status"]["phase"] = "Exploded"
    assert parse_trainingjob(body).status.phase is None


def _with(path: str, value: Any) -> dict[str, Any]:
    """A valid body with one field (dotted path under spec) set to `value`."""
    body = make_body()
    node = body["spec"]
    *parents, last = path.split(".")
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node.setdefault(key, {})
    node[last] = value
    return body


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        pytest.param("workers", 0, ["spec.workers", "(got 0)"], id="workers-zero"),
        pytest.param("workers", 10_001, ["spec.workers", "10000"], id="workers-too-many"),
        pytest.param("gpusPerWorker", 65, ["spec.gpusPerWorker", "(got 65)"], id="gpus"),
        pytest.param("image", "", ["spec.image", "(got '')"], id="image-empty"),
        pytest.param("masterPort", 70000, ["spec.masterPort", "(got 70000)"], id="port"),
        pytest.param(
            "runPolicy.failurePolicy.maxRestarts", -1,
            ["spec.runPolicy.failurePolicy.maxRestarts", "(got -1)"], id="max-restarts",
        ),
        pytest.param(
            "runPolicy.successPolicy", "Rank1",
            ["spec.runPolicy.successPolicy", "'AllWorkers' or 'Rank0'", "(got 'Rank1')"],
            id="success-policy",
        ),
        pytest.param(
            "runPolicy.activeDeadlineSeconds", 0,
            ["spec.runPolicy.activeDeadlineSeconds", "(got 0)"], id="deadline-zero",
        ),
        pytest.param("bogus", 1, ["spec.bogus", "Extra inputs", "(got 1)"], id="unknown-field"),
        pytest.param(
            "runPolicy.suspended", True, ["spec.runPolicy.suspended", "Extra inputs"],
            id="unknown-nested-field",
        ),
        pytest.param(
            "env", [{"name": "A", "valu": "x"}], ["spec.env[0].valu", "Extra inputs", "'x'"],
            id="unknown-env-field",
        ),
        pytest.param(
            "env", [{"name": "1BAD"}], ["spec.env[0].name", "pattern", "(got '1BAD')"],
            id="env-name-pattern",
        ),
        pytest.param(
            "runPolicy.failurePolicy.rules", [rule("Retry", "In", 1)],
            ["spec.runPolicy.failurePolicy.rules[0].action", "(got 'Retry')"], id="rule-action",
        ),
        pytest.param(
            "runPolicy.failurePolicy.rules", [rule("FailJob", "In")],
            ["spec.runPolicy.failurePolicy.rules[0].onExitCodes.values", "at least 1"],
            id="rule-no-codes",
        ),
    ],
)  # fmt: skip
def test_invalid_spec_names_the_field_and_the_value(
    path: str, value: Any, expected: list[str]
) -> None:
    with pytest.raises(InvalidSpec) as raised:
        parse_trainingjob(_with(path, value))
    for part in expected:
        assert part in str(raised.value)


def test_missing_required_fields_are_all_named() -> None:
    body = make_body()
    body["spec"] = {}
    with pytest.raises(InvalidSpec, match=r"spec\.workers: Field required") as raised:
        parse_trainingjob(body)
    assert "spec.image: Field required" in str(raised.value)
    assert "(got" not in str(raised.value), "a whole object is not echoed back"


# --- the generated CRD ----------------------------------------------------------------------

CRD = build_crd()
(VERSION,) = CRD["spec"]["versions"]
ROOT_SCHEMA = VERSION["schema"]["openAPIV3Schema"]
SPEC_SCHEMA = ROOT_SCHEMA["properties"]["spec"]
STATUS_SCHEMA = ROOT_SCHEMA["properties"]["status"]
RULES = ".spec.runPolicy.failurePolicy.rules[]"


def walk(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every schema node with its path, properties, items and additionalProperties alike."""
    yield path, node
    for name, sub in node.get("properties", {}).items():
        yield from walk(sub, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from walk(node["additionalProperties"], f"{path}{{}}")


NODES = list(walk(ROOT_SCHEMA))


def test_schema_is_structural() -> None:
    assert len(NODES) > 50
    for path, node in NODES:
        for keyword in ("$ref", "$defs", "title", "allOf", "oneOf", "not", "const"):
            assert keyword not in node, f"{path or '<root>'} has {keyword}"
        if "anyOf" in node:
            assert node.get("x-kubernetes-int-or-string") is True, f"{path} has anyOf"
            assert "type" not in node, f"{path}: int-or-string must not set a type"
        typed = "type" in node or any(
            node.get(f"x-kubernetes-{ext}") for ext in ("preserve-unknown-fields", "int-or-string")
        )
        assert typed, f"{path} has neither a type nor x-kubernetes-preserve-unknown-fields"
        assert node.get("type") != "null", f"{path} is null-typed"
        for bound in ("exclusiveMinimum", "exclusiveMaximum"):
            assert node.get(bound, True) is True, f"{path}: {bound} must be a boolean"


def test_list_maps_are_keyed_by_required_fields() -> None:
    maps = {path: node for path, node in NODES if node.get("x-kubernetes-list-type") == "map"}
    assert set(maps) == {".spec.env", ".status.conditions"}
    for path, node in maps.items():
        for key in node["x-kubernetes-list-map-keys"]:
            assert key in node["items"].get("required", []), f"{path} key {key} not required"


@pytest.mark.parametrize(
    ("path", "default"),
    [
        pytest.param(".spec.processesPerWorker", 1, id="processesPerWorker"),
        pytest.param(".spec.gpusPerWorker", 0, id="gpusPerWorker"),
        pytest.param(".spec.masterPort", 29500, id="masterPort"),
        pytest.param(".spec.runPolicy", {}, id="runPolicy"),
        pytest.param(".spec.runPolicy.failurePolicy", {}, id="failurePolicy"),
        pytest.param(".spec.runPolicy.failurePolicy.maxRestarts", 3, id="maxRestarts"),
        pytest.param(".spec.runPolicy.successPolicy", "AllWorkers", id="successPolicy"),
        pytest.param(".spec.runPolicy.suspend", False, id="suspend"),
    ],
)
def test_defaults_are_in_the_schema(path: str, default: object) -> None:
    assert dict(NODES)[path]["default"] == default


def test_optional_fields_have_no_null_default() -> None:
    nodes = dict(NODES)
    for path in (".spec.imagePullPolicy", ".spec.runPolicy.activeDeadlineSeconds"):
        assert "default" not in nodes[path]
    assert nodes[".spec.imagePullPolicy"]["enum"] == ["Always", "IfNotPresent", "Never"]


def test_descriptions_start_with_the_json_name() -> None:
    for path, node in NODES:
        name = path.rsplit(".", 1)[-1]
        if not path.startswith(".spec.") or name.endswith(("[]", "{}")):
            continue
        assert node["description"].startswith(name), f"{path}: {node['description'][:40]!r}"


def test_quantities_are_int_or_string() -> None:
    quantity = dict(NODES)[".spec.resources.requests{}"]
    assert quantity["anyOf"] == [{"type": "integer"}, {"type": "string"}]
    assert quantity["pattern"].startswith("^")


def validations_by_path() -> list[tuple[str, dict[str, str]]]:
    return [
        (path, rule) for path, node in NODES for rule in node.get("x-kubernetes-validations", [])
    ]


def test_every_cel_rule_has_a_message_naming_its_field() -> None:
    rules = validations_by_path()
    assert len(rules) >= len(IMMUTABLE_WHILE_RUNNING) + 5
    for path, entry in rules:
        assert entry["rule"], path
        assert entry["message"], path
        field = entry.get("fieldPath", path).rsplit(".", 1)[-1] or "metadata.name"
        assert field in entry["message"], f"{path}: {entry['message']!r} does not name {field}"


@pytest.mark.parametrize("field", IMMUTABLE_WHILE_RUNNING)
def test_pod_shaping_fields_are_immutable_unless_suspended(field: str) -> None:
    (entry,) = [
        r for p, r in validations_by_path() if p == ".spec" and r.get("fieldPath") == f".{field}"
    ]
    assert field in SPEC_SCHEMA["properties"], f"{field} is not a spec field"
    assert entry["rule"].startswith("oldSelf.runPolicy.suspend || ")
    assert f"has(self.{field})" in entry["rule"], "an unset optional field must not error"
    assert entry["message"].startswith(f"spec.{field} is immutable")


@pytest.mark.parametrize(
    ("path", "fragment"),
    [
        pytest.param("", "size(self.metadata.name) <= 51", id="name-length"),
        pytest.param("", "self.metadata.name.matches(", id="name-dns-1035"),
        pytest.param(".spec.env", "'MASTER_ADDR'", id="reserved-env"),
        pytest.param(f"{RULES}.onExitCodes", "!(0 in ", id="no-zero-exit-code"),
        pytest.param(f"{RULES}.onExitCodes", "exists_one", id="no-duplicates"),
        pytest.param(RULES, ".filter(x, x).size() == 1", id="one-matcher-per-rule"),
    ],
)
def test_cel_rules_are_present(path: str, fragment: str) -> None:
    assert any(p == path and fragment in r["rule"] for p, r in validations_by_path())


def test_printer_columns_point_at_status_fields() -> None:
    columns = VERSION["additionalPrinterColumns"]
    assert [c["name"] for c in columns if "priority" not in c] == [
        "Phase", "Ready", "Restarts", "Disruptions", "GPUs", "Progress", "Age",
    ]  # fmt: skip
    for column in columns:
        kind, *path = column["jsonPath"].lstrip(".").split(".")
        if kind == "status":
            schema = STATUS_SCHEMA
            for field in path:
                schema = schema["properties"][field]
            assert schema["type"] == column["type"], column["jsonPath"]


def test_crd_names_and_subresources() -> None:
    names = CRD["spec"]["names"]
    assert CRD["metadata"]["name"] == "trainingjobs.trainwave.io"
    assert (names["kind"], names["shortNames"], CRD["spec"]["scope"]) == (
        "TrainingJob", ["tj"], "Namespaced",
    )  # fmt: skip
    assert VERSION["subresources"] == {"status": {}}
    assert (VERSION["name"], VERSION["served"], VERSION["storage"]) == ("v1alpha1", True, True)


def test_committed_crd_matches_the_models() -> None:
    assert render_crd() == CRD_FILE.read_text(encoding="utf-8"), "run `make generate`"
    assert yaml.safe_load(CRD_FILE.read_text(encoding="utf-8")) == CRD


def test_committed_chart_crd_matches_the_models() -> None:
    assert render_chart_crd() == CHART_CRD_FILE.read_text(encoding="utf-8"), "run `make generate`"


def test_chart_crd_has_the_enable_and_keep_toggles() -> None:
    text = render_chart_crd()
    lines = text.splitlines()
    assert lines[1] == "{{- if .Values.crds.enabled }}"
    assert lines[-1] == "{{- end }}"
    assert (
        "  {{- if .Values.crds.keep }}\n  annotations:\n    helm.sh/resource-policy: keep\n" in text
    )
    assert '{{- include "trainwave.labels" . | nindent 4 }}' in text


# --- the JSON Schema -> structural schema translation ---------------------------------------


class _Sample(BaseModel):
    positive: int = Field(gt=0)
    fixed: Literal["only"] = "only"
    maybe: str | None = None


def test_translation_of_bounds_consts_and_optionals() -> None:
    schema = openapi_schema(_Sample)
    props = schema["properties"]
    assert props["positive"] == {"type": "integer", "minimum": 0, "exclusiveMinimum": True}
    assert props["fixed"] == {"type": "string", "enum": ["only"], "default": "only"}
    assert props["maybe"] == {"type": "string"}
    assert schema["required"] == ["positive"]


class _Union(BaseModel):
    either: int | str


def test_untranslatable_union_is_refused() -> None:
    with pytest.raises(ValueError, match="cannot express a union"):
        openapi_schema(_Union)
