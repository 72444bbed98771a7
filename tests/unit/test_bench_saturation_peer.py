"""The pure parts of the saturation benchmark's Kueue peer: the Jobs and queue it builds
(tests/benchmarks/saturation_kueue.py) and the side-by-side figures
(tests/benchmarks/saturation_compare.py). The run itself is the benchmark
(BENCH_PEER=kueue make bench-saturation)."""

from __future__ import annotations

import pytest

from benchmarks.saturation_analysis import GangSpan, PodSpan
from benchmarks.saturation_compare import (
    comparison_rows,
    kueue_stages,
    racks_used,
    side_figures,
    verdict,
)
from benchmarks.saturation_kueue import (
    QUEUE,
    batch_job,
    cluster_quota,
    memory_in_gi,
    queue_objects,
)
from benchmarks.saturation_stream import CONFIGS, make_stream, training_job
from trainwave import contract

pytestmark = pytest.mark.timeout(10)


def pod(gang: str, node: str, start: float, end: float | None) -> PodSpan:
    return PodSpan(gang, node, 8, start - 0.2, start - 0.1, start, end)


def gang(name: str, arrival: float, *pods: PodSpan) -> GangSpan:
    return GangSpan(name, len(pods), 8 * len(pods), arrival, 10.0, pods)


@pytest.mark.parametrize("tas", [True, False], ids=["tas", "no-tas"])
def test_batch_job_asks_what_the_training_job_asks(tas: bool) -> None:
    job = next(j for j in make_stream(CONFIGS["small"]) if j.workers > 1)
    body = batch_job(job, "ns", tas=tas)
    twin = training_job(job, "ns")
    spec, template = body["spec"], body["spec"]["template"]
    assert spec["suspend"] is True  # as Kueue's Job webhook sets it
    assert spec["parallelism"] == spec["completions"] == job.workers
    assert body["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == QUEUE
    requests = template["spec"]["containers"][0]["resources"]["requests"]
    assert requests["nvidia.com/gpu"] == str(twin["spec"]["gpusPerWorker"])
    assert requests["cpu"] == twin["spec"]["resources"]["requests"]["cpu"]
    assert requests["memory"] == twin["spec"]["resources"]["requests"]["memory"]
    ours = twin["spec"]["template"]["metadata"]["annotations"]
    annotations = template["metadata"]["annotations"]
    assert {k: annotations[k] for k in ours} == ours  # kwok runs both for the same time
    preferred = annotations.get("kueue.x-k8s.io/podset-preferred-topology")
    assert preferred == (contract.NODE_LABEL_RACK if tas else None)


def test_quota_is_the_whole_cluster() -> None:
    node = {"status": {"allocatable": {"nvidia.com/gpu": "8", "cpu": "192", "memory": "2Ti"}}}
    assert cluster_quota([node] * 64) == {
        "nvidia.com/gpu": "512",
        "cpu": "12288",
        "memory": f"{64 * 2048}Gi",
    }


def test_memory_other_than_whole_gi_is_refused_by_value() -> None:
    assert memory_in_gi("1024Gi") == 1024
    with pytest.raises(ValueError, match="'1500Mi'"):
        memory_in_gi("1500Mi")


@pytest.mark.parametrize("tas", [True, False], ids=["tas", "no-tas"])
def test_queue_objects(tas: bool) -> None:
    objects = queue_objects("kueue.x-k8s.io/v1beta2", {"nvidia.com/gpu": "16"}, tas=tas)
    kinds = [o["kind"] for o in objects]
    assert kinds == (["Topology"] if tas else []) + ["ResourceFlavor", "ClusterQueue", "LocalQueue"]
    flavor = objects[kinds.index("ResourceFlavor")]["spec"]
    assert ("topologyName" in flavor) == tas
    queue = objects[kinds.index("ClusterQueue")]["spec"]
    assert queue["namespaceSelector"] == {}
    assert queue["resourceGroups"][0]["flavors"][0]["resources"] == [
        {"name": "nvidia.com/gpu", "nominalQuota": "16"}
    ]


def test_racks_used_reads_the_rack_from_node_names() -> None:
    gangs = [
        gang("one", 0.0, pod("one", "gpu-r00-n00", 1, 5), pod("one", "gpu-r00-n01", 1, 5)),
        gang("two", 0.0, pod("two", "gpu-r00-n02", 1, 5), pod("two", "gpu-r01-n00", 1, 5)),
        gang("big", 0.0, *(pod("big", f"gpu-r02-n{i:02d}", 1, 5) for i in range(3))),
    ]
    assert racks_used(gangs, rack_nodes=2) == {"one_rack": 1, "spread": 1}


@pytest.mark.parametrize(
    ("ours", "theirs", "lower", "expected"),
    [
        pytest.param(1.0, 2.0, True, "trainwave", id="lower-wins"),
        pytest.param(1.0, 2.0, False, "Kueue", id="higher-wins"),
        pytest.param(1.0, 1.0, True, "same", id="tie"),
        pytest.param(None, 1.0, True, "", id="missing"),
    ],
)
def test_verdict(ours: float | None, theirs: float, lower: bool, expected: str) -> None:
    assert verdict(ours, theirs, lower) == expected


def test_both_sides_through_the_same_figures() -> None:
    # a on node n00 ends at 10; b waited for it and ran at 11 (ours) or 14 (theirs).
    def run(start_b: float) -> list[GangSpan]:
        return [
            gang("a", 0.0, pod("a", "gpu-r00-n00", 1.0, 10.0)),
            gang("b", 0.5, pod("b", "gpu-r00-n00", start_b, start_b + 10)),
        ]

    shape = {"finished": True, "nodes": 1, "node_gpus": 8, "rack_nodes": 8}
    ours = side_figures(run(11.0), {}, **shape)
    theirs = side_figures(run(14.0), {}, **shape)
    rows = {label: (a, b, who) for label, a, b, who in comparison_rows(ours, theirs)}
    assert rows["hand-off lag p50, s"] == (1.0, 4.0, "trainwave")
    assert rows["makespan, s"] == (21.0, 24.0, "trainwave")
    stages = kueue_stages(run(14.0), {"b": {"admitted": 12.0}, "a": {"finished": 10.5}}, 8)
    assert stages["room_to_quota_reserved (Kueue)"]["p50"] == 2.0
    assert stages["quota_reserved_to_released (Job controller, TAS ungater)"]["p50"] == 1.8
    assert stages["last_worker_ended_to_workload_finished"]["p50"] == 0.5
