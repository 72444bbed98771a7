"""The agent's node diff: which labels, annotations and resources move, and what stays put."""

from __future__ import annotations

from typing import Any

import pytest

from trainwave.agent.changes import Change, DesiredNode, diff_node, quantity_value
from trainwave.contract import ANNOTATION_AGENT_LABELS, SHARED_GPU_MEMORY_RESOURCE

pytestmark = pytest.mark.timeout(10)

MEM = SHARED_GPU_MEMORY_RESOURCE
GPU_LABELS = {"nvidia.com/gpu.count": "8", "trainwave.io/rdma": "infiniband"}
RECORD = {ANNOTATION_AGENT_LABELS: "nvidia.com/gpu.count,trainwave.io/rdma"}


def make_node(
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    capacity: dict[str, str] | None = None,
    allocatable: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A Node as the API server returns it; the kubelet's own capacity is always there."""
    base = {"cpu": "128", "pods": "110"}
    return {
        "metadata": {"name": "n", "labels": labels or {}, "annotations": annotations or {}},
        "status": {
            "capacity": base | (capacity or {}),
            "allocatable": base | (allocatable if allocatable is not None else capacity or {}),
        },
    }


def desired(
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    resources: dict[str, int] | None = None,
) -> DesiredNode:
    return DesiredNode(labels or {}, annotations or {}, resources or {})


CASES = [
    pytest.param(
        make_node(),
        desired(GPU_LABELS, {"trainwave.io/inventory": "{}"}),
        {
            "metadata": {
                "labels": GPU_LABELS,
                "annotations": {"trainwave.io/inventory": "{}"} | RECORD,
            }
        },
        {},
        id="first-pass-sets-labels-and-records-them",
    ),
    pytest.param(
        make_node(GPU_LABELS | {"team": "a"}, RECORD),
        desired(GPU_LABELS),
        {},
        {},
        id="nothing-changed-nothing-sent",
    ),
    pytest.param(
        make_node(GPU_LABELS | {"team": "a"}, RECORD),
        desired({"nvidia.com/gpu.count": "8"}),
        {
            "metadata": {
                "labels": {"trainwave.io/rdma": None},
                "annotations": {ANNOTATION_AGENT_LABELS: "nvidia.com/gpu.count"},
            }
        },
        {},
        id="stale-own-label-removed-foreign-kept",
    ),
    pytest.param(
        # GPU feature discovery wrote gpu.count before the agent ever ran: the
        # agent did not publish it, so it leaves it alone when it finds no GPUs.
        make_node({"nvidia.com/gpu.count": "8"}, {ANNOTATION_AGENT_LABELS: ""}),
        desired(),
        {},
        {},
        id="unrecorded-label-never-removed",
    ),
    pytest.param(
        make_node({"nvidia.com/gpu.count": "4"}, {ANNOTATION_AGENT_LABELS: "nvidia.com/gpu.count"}),
        desired({"nvidia.com/gpu.count": "8"}),
        {"metadata": {"labels": {"nvidia.com/gpu.count": "8"}}},
        {},
        id="changed-value-overwritten",
    ),
    pytest.param(
        make_node(annotations={ANNOTATION_AGENT_LABELS: ""}),
        desired(resources={MEM: 163118}),
        {},
        {"status": {"capacity": {MEM: "163118"}, "allocatable": {MEM: "163118"}}},
        id="shared-memory-added-to-capacity-and-allocatable",
    ),
    pytest.param(
        make_node(annotations={ANNOTATION_AGENT_LABELS: ""}, capacity={MEM: "81k"}),
        desired(resources={MEM: 81000}),
        {},
        {},
        id="canonical-quantity-equals-integer",
    ),
    pytest.param(
        make_node(annotations={ANNOTATION_AGENT_LABELS: ""}, capacity={MEM: "81559"}),
        desired(),
        {},
        {"status": {"capacity": {MEM: None}, "allocatable": {MEM: None}}},
        id="sharing-switched-off-removes-resource",
    ),
    pytest.param(
        make_node(
            annotations={ANNOTATION_AGENT_LABELS: ""}, capacity={MEM: "81559"}, allocatable={}
        ),
        desired(resources={MEM: 81559}),
        {},
        {"status": {"allocatable": {MEM: "81559"}}},
        id="only-the-missing-side-is-patched",
    ),
]


@pytest.mark.parametrize(("node", "want", "node_patch", "status_patch"), CASES)
def test_diff_node(
    node: dict[str, Any],
    want: DesiredNode,
    node_patch: dict[str, Any],
    status_patch: dict[str, Any],
) -> None:
    patches = diff_node(node, want)

    assert patches.node == node_patch
    assert patches.status == status_patch
    assert bool(patches.changes) == bool(node_patch or status_patch)


def test_changes_name_every_moving_key() -> None:
    node = make_node(GPU_LABELS, RECORD, capacity={MEM: "1"})
    patches = diff_node(node, desired({"nvidia.com/gpu.count": "4"}, resources={MEM: 2}))

    assert patches.changes == (
        Change("label", "nvidia.com/gpu.count", "8", "4"),
        Change("label", "trainwave.io/rdma", "infiniband", None),
        Change(
            "annotation",
            ANNOTATION_AGENT_LABELS,
            RECORD[ANNOTATION_AGENT_LABELS],
            "nvidia.com/gpu.count",
        ),
        Change("capacity", MEM, "1", "2"),
        Change("allocatable", MEM, "1", "2"),
    )


@pytest.mark.parametrize(
    ("change", "line"),
    [
        pytest.param(
            Change("label", "a/b", None, "8"), "change=label-added key=a/b new='8'", id="added"
        ),
        pytest.param(
            Change("label", "a/b", "8", None), "change=label-removed key=a/b old='8'", id="removed"
        ),
        pytest.param(
            Change("capacity", MEM, "1", "2"),
            f"change=capacity-changed key={MEM} old='1' new='2'",
            id="changed",
        ),
        pytest.param(
            Change("annotation", "x", '{"a":1}', "{}"),
            "change=annotation-changed key=x old_bytes=7 new_bytes=2",
            id="annotation-sizes-not-json",
        ),
    ],
)
def test_change_log_line(change: Change, line: str) -> None:
    assert str(change) == line


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("163118", 163118),
        ("81k", 81_000),
        ("2M", 2_000_000),
        ("1Ki", 1024),
        ("500m", None),
        ("1e3", 1000),
        ("", None),
    ],
    ids=["plain", "kilo", "mega", "kibi", "milli", "exponent", "empty"],
)
def test_quantity_value(text: str, value: int | None) -> None:
    assert quantity_value(text) == value
