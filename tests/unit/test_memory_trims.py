"""What the operator keeps of what it reads is trimmed without changing what decisions see
(issue 27 item 6): job bodies without managedFields, one copy of equal inventory parts and
label strings; and the heap report is off unless asked for."""

from __future__ import annotations

import tracemalloc
from typing import Any

import pytest

from cluster.inventory import inventory_annotation
from trainwave import contract
from trainwave.controller import heap_report
from trainwave.hardware.inventory import decode
from trainwave.placement.records import node_record, pod_record
from unit.test_job_cache import Cluster, raw_job

pytestmark = pytest.mark.timeout(20)


def annotated_node(name: str) -> dict[str, Any]:
    annotations = inventory_annotation(
        name, gpus=8, product="H100", memory_mib=81559, nics=8, link_layer="IB",
        rate_gbps=400, gpu_direct=True, shared=False,
    )  # fmt: skip
    # Built at run time, as json.loads builds them: a fresh string object per node.
    labels = {"".join(["trainwave.io/", "rack"]): "".join(["rack-", "07"]), "host": name}
    return {"metadata": {"name": name, "labels": labels, "annotations": annotations}}


def test_a_job_body_is_kept_without_managed_fields_and_with_everything_else() -> None:
    job = raw_job("a")
    job["metadata"]["managedFields"] = [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}]
    with Cluster([job], [], []) as cache:
        body = cache.body(("ns", "a"))
    assert body is not None
    assert "managedFields" not in body["metadata"]
    assert body["metadata"]["resourceVersion"] == "1"
    assert body["spec"] == {"workers": 2}
    assert body["status"] == {"phase": "Running"}


def test_equal_nics_and_distances_of_two_nodes_are_one_object_and_gpus_stay_apart() -> None:
    first, second = (
        decode(annotated_node(n)["metadata"]["annotations"][contract.ANNOTATION_INVENTORY])
        for n in ("node-a", "node-b")
    )
    assert first.nics == second.nics
    assert all(a is b for a, b in zip(first.nics, second.nics, strict=True))
    assert all(a is b for a, b in zip(first.nearest_nics, second.nearest_nics, strict=True))
    assert first.gpus[0].product is second.gpus[0].product


def test_node_and_pod_labels_are_shared_strings_with_the_same_values() -> None:
    a, b = node_record(annotated_node("node-a")), node_record(annotated_node("node-b"))
    rack = "trainwave.io/rack"
    assert a.labels[rack] == "rack-07"
    assert a.labels[rack] is b.labels[rack]
    assert next(k for k in a.labels if k == rack) is next(k for k in b.labels if k == rack)
    pod = {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u", "labels": {"app": "x" + "y"}},
        "spec": {"nodeName": "node-a", "containers": []},
        "status": {"phase": "Running"},
    }
    record = pod_record(pod)
    assert record is not None
    assert record.labels == (("app", "xy"),)


def test_the_heap_report_is_off_unless_asked_and_names_the_lines_that_hold_memory() -> None:
    assert not heap_report.install_from_env({})
    assert not heap_report.install_from_env({heap_report.ENV_FRAMES: "0"})
    tracemalloc.start(4)
    try:
        held = [bytearray(4096) for _ in range(256)]  # 1 MiB on this line
        text = heap_report.report(tracemalloc.take_snapshot(), "test", top=10)
    finally:
        tracemalloc.stop()
    assert len(held) == 256
    assert "## by owner" in text
    assert "unit/test_memory_trims.py" in text.split("## by owner")[1].split("##")[0]
