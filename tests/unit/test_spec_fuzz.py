"""Fuzzing the operator's pure core: any spec, valid or broken, either fails as InvalidSpec
naming a field, or yields well-formed pods. No other exception, ever.

The path is the reconciler's: resolve (the one parse and check), decide, then the
builders for the ranks decide asks for. Examples are derandomized, so a CI run is
reproducible; TRAINWAVE_FUZZ_EXAMPLES asks for a longer run.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

import pytest
from factories import NOW, make_body
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from manifest_strategies import IMAGE, specs

from trainwave import contract
from trainwave.api.podspec import POD_SPEC, shape_problem
from trainwave.api.status import Phase
from trainwave.api.trainingjob import InvalidSpec, parse_metadata, parse_status
from trainwave.builders.pods import build_worker_pods
from trainwave.builders.service import build_service
from trainwave.lifecycle.decide import decide, decide_invalid
from trainwave.resolving import resolve

pytestmark = pytest.mark.timeout(300)
EXAMPLES = int(os.environ.get("TRAINWAVE_FUZZ_EXAMPLES", "2000"))
# "spec.template.spec.volumes[0] must be...", "spec.workers: Input should be...".
FIELD = re.compile(r"\bspec(\.[A-Za-z]+|\[)")


def body_of(spec: dict[str, Any]) -> dict[str, Any]:
    body = make_body()
    body["spec"] = spec
    return body


def outcome(body: dict[str, Any]) -> str:
    """What the reconciler would do with `body`, checked; "InvalidSpec" or "built"."""
    try:
        resolved = resolve(body)
    except InvalidSpec as invalid:
        refused = str(invalid)
    else:
        refused = ""
    if refused:
        assert FIELD.search(refused), f"names no field: {refused}"
        failed = decide_invalid(parse_metadata(body), parse_status(body), [], refused, NOW)
        assert failed.status.phase == Phase.FAILED
        assert failed.status.reason == "InvalidSpec"
        return "InvalidSpec"
    decision = decide(resolved, [], NOW)
    assert decision.status.phase is not None
    assert decision.status.reason
    workers = resolved.job.spec.workers
    ranks = decision.create_ranks or (0,)
    ranks = tuple(sorted({ranks[0], ranks[-1], workers - 1}))  # not 10,000 pods per example
    for pod in build_worker_pods(resolved, ranks, decision.status.attempt):
        check_pod(pod)
    json.dumps(build_service(resolved.job, 0))
    return "built"


def check_pod(pod: dict[str, Any]) -> None:
    json.dumps(pod)  # only JSON types: it goes to the API server as it is
    spec = pod["spec"]
    assert shape_problem(spec, POD_SPEC, "pod.spec") is None, shape_problem(spec, POD_SPEC, "pod")
    assert all(isinstance(v, str) for v in pod["metadata"]["labels"].values())
    assert all(isinstance(v, str) for v in pod["metadata"]["annotations"].values())
    names = [c["name"] for c in spec["containers"]]
    assert names.count(contract.WORKER_CONTAINER) == 1
    worker = spec["containers"][names.index(contract.WORKER_CONTAINER)]
    assert worker["image"] == IMAGE
    assert spec["restartPolicy"] == "Never"
    assert {"name": contract.SCHEDULING_GATE} in spec["schedulingGates"]
    env = [e["name"] for e in worker["env"]]
    assert contract.ENV_RANK in env
    assert contract.ENV_WORLD_SIZE in env


SEEN: dict[str, int] = {}


@settings(
    max_examples=EXAMPLES,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(specs())
def test_any_spec_is_refused_naming_a_field_or_builds_well_formed_pods(spec) -> None:
    result = outcome(body_of(spec))
    SEEN[result] = SEEN.get(result, 0) + 1


def test_the_fuzz_reached_both_outcomes() -> None:
    """An honest fuzz run: had every example been refused (or none), it tested little."""
    if not SEEN:
        pytest.skip("runs after the fuzz test in the same session")
    print(f"spec fuzz: {EXAMPLES} examples, outcomes {SEEN}")  # shown with -s
    assert SEEN.get("InvalidSpec", 0) > EXAMPLES // 10, SEEN
    assert SEEN.get("built", 0) > EXAMPLES // 10, SEEN


@given(st.data())
@settings(max_examples=300, derandomize=True, database=None, deadline=None)
def test_a_wrong_type_inside_the_template_names_the_field_and_the_value(data) -> None:
    """Any non-object in place of a template container is caught before the builders."""
    value = data.draw(st.none() | st.integers() | st.text(max_size=5) | st.lists(st.integers()))
    template = {"spec": {"containers": [{"name": "worker"}, value]}}
    body = make_body(template=template, runtime={}, command=["python"])
    with pytest.raises(InvalidSpec) as raised:
        resolve(body)
    assert str(raised.value) == (
        f"spec.template.spec.containers[1] must be an object (got {value!r})"
        if len(repr(value)) <= 60
        else str(raised.value)
    )
