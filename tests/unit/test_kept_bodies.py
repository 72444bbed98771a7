"""What the operator keeps of each job and worker between events: a cut that no decision
can tell from the object the API sent (every field a decision reads survives it), with
each string kept once however many events and objects repeat it."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest

from trainwave.controller.reading import kept_body, read_job
from trainwave.lifecycle.observed import observe_pod
from trainwave.placement.records import pod_record
from unit.factories import NOW, make_body, make_pod_body

pytestmark = pytest.mark.timeout(10)

MANAGED = [{"manager": "trainwave", "operation": "Update", "fieldsV1": {"f:status": {}}}]


def decoded(obj: dict[str, Any]) -> dict[str, Any]:
    """A fresh copy, as each watch event or API answer is: no string shared with `obj`."""
    return json.loads(json.dumps(obj))


def job_bodies() -> list[Any]:
    failure = {"rules": [{"action": "Ignore", "onExitCodes": {"operator": "In", "values": [3]}}]}
    status = {"conditions": [{"type": "Running", "status": "True", "reason": "AllWorkersRunning",
                              "lastTransitionTime": "2026-11-27T16:02:04Z", "message": "2 running"}],
              "placement": {"nodes": ["node-0", "node-0"], "summary": "2 workers on 1 node"},
              "goodput": {"ratio": 0.75}, "allRunningTime": "2026-11-27T16:02:04Z"}  # fmt: skip
    labelled = make_body(phase="Running", status_extra=status, failure_policy=failure)
    labelled["metadata"].update(
        labels={"kueue.x-k8s.io/queue-name": "q"},
        deletionTimestamp="2026-11-27T16:03:00Z",
        creationTimestamp="2026-11-27T16:00:00Z",
        managedFields=MANAGED,
    )
    return [
        pytest.param(make_body(), id="new"),
        pytest.param(labelled, id="running-labelled-deleting-managed"),
        pytest.param({"metadata": {"name": "x", "namespace": "ns", "uid": "u"}}, id="bare"),
    ]


@pytest.mark.parametrize("raw", job_bodies())
def test_a_kept_job_reads_as_the_job_the_api_sent(raw: dict[str, Any]) -> None:
    kept = kept_body(decoded(raw))
    sent, read = read_job(decoded(raw)), read_job(kept)
    assert (read.meta, read.spec, read.status, read.invalid) == (
        sent.meta, sent.spec, sent.status, sent.invalid
    )  # fmt: skip
    expected = {k: v for k, v in decoded(raw).items() if k in ("metadata", "spec", "status")}
    expected["metadata"].pop("managedFields", None)
    assert kept == expected, "all but managedFields (and apiVersion, kind) is kept"


def test_two_kept_bodies_share_their_keys_and_repeated_values() -> None:
    raw = make_body(phase="Running", status_extra={"placement": {"nodes": ["node-0", "node-0"]}})
    one, two = kept_body(decoded(raw)), kept_body(decoded(raw))
    assert one["status"]["phase"] is two["status"]["phase"]
    assert next(iter(one["spec"])) is next(iter(two["spec"]))
    nodes = one["status"]["placement"]["nodes"]
    assert nodes[0] is nodes[1] is two["status"]["placement"]["nodes"][0]


def pod_bodies() -> list[Any]:
    disrupted = {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}
    failed = make_pod_body(
        1,
        2,
        "Failed",
        exit_code=137,
        container_reason="OOMKilled",
        finished_at=NOW - timedelta(seconds=5),
        pod_reason="Evicted",
        conditions=(disrupted,),
    )
    gated = make_pod_body(
        0, gated=True, bound=False, placed_node="node-7", released_at=NOW, pod_ip="10.0.0.3"
    )
    return [
        pytest.param(make_pod_body(0), id="running"),
        pytest.param(failed, id="failed-disrupted"),
        pytest.param(gated, id="gated-placed"),
        pytest.param(make_pod_body(3, deleting=True), id="deleting"),
    ]


@pytest.mark.parametrize("raw", pod_bodies())
def test_a_worker_kept_twice_is_equal_and_shares_its_strings(raw: dict[str, Any]) -> None:
    one, two = observe_pod(decoded(raw)), observe_pod(decoded(raw))
    assert one is not None
    assert one == two
    assert (one.name, one.node, one.owner_uid) == (two.name, two.node, two.owner_uid)
    assert all(a is b for a, b in zip((one.name, one.node, one.owner_uid),
                                      (two.name, two.node, two.owner_uid), strict=True))  # fmt: skip
    for first, second in zip(one.conditions, two.conditions, strict=True):
        assert first.type is second.type
        assert first.status is second.status
    assert one.disruption == (raw["status"]["conditions"][-1].get("reason") or "")
    record = pod_record(decoded(raw))
    assert record is not None
    assert record.name is one.name
    assert record.uid is one.uid
