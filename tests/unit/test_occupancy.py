"""GPU gauges from a snapshot (placement/occupancy.py) and the collector that serves them."""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType

import pytest
from placement_factories import make_cluster, make_node
from prometheus_client import CollectorRegistry, generate_latest

from trainwave.controller.metrics import PlacementGauges, PlacementState
from trainwave.placement.occupancy import (
    DomainGpus,
    SharedFragmentation,
    gpus_by_domain,
    shared_fragmentation,
)
from trainwave.placement.records import SharedGpu
from trainwave.placement.shared_tasks import SharedShape
from trainwave.placement.snapshot import ClusterSnapshot, NodeInfo

pytestmark = pytest.mark.timeout(10)
GPU = 80_000


def counts(snapshot: ClusterSnapshot) -> dict[tuple[str, str, str], int]:
    return {(r.level, r.domain, r.state): r.gpus for r in gpus_by_domain(snapshot)}


def test_gpus_are_summed_per_domain_of_each_level_above_the_node() -> None:
    table = counts(make_cluster([8, 2], [0], spines=[1, 1]))
    assert table[("cluster", "cluster", "allocated")] == 6 + 8
    assert table[("cluster", "cluster", "free")] == 10
    assert table[("rack", "rack-0", "free")] == 10
    assert table[("rack", "rack-1", "allocated")] == 8
    assert table[("spine", "spine-1", "free")] == 0
    assert not any(level == "node" for level, _, _ in table)


def test_gpus_of_closed_nodes_are_unavailable_not_free() -> None:
    cordoned = replace(make_node("a", free=3), cordoned=True)
    gone = replace(make_node("b", free=8), ready=False)
    table = counts(ClusterSnapshot.of([cordoned, gone, make_node("c", free=1)]))
    assert table[("cluster", "cluster", "unavailable")] == 3 + 8
    assert table[("cluster", "cluster", "free")] == 1
    assert table[("cluster", "cluster", "allocated")] == 5 + 7


def shared_node(name: str, *used: int) -> NodeInfo:
    gpus = tuple(SharedGpu(f"GPU-{name}-{i}", i, GPU, u) for i, u in enumerate(used))
    return replace(make_node(name, gpus=0), shared=gpus)


def test_fragmentation_counts_the_idle_memory_no_typical_task_can_use() -> None:
    # Every GPU 90% used: 100 milli idle each, smaller than any typical shape (250 and up).
    crowded = ClusterSnapshot.of([shared_node("a", 72_000, 72_000)])
    result = shared_fragmentation(crowded)
    assert result.gpus == 2
    assert result.idle_milli == 200
    assert result.fragmented_milli == pytest.approx(200)
    # Empty GPUs: every shape fits, nothing is fragmented.
    empty = shared_fragmentation(ClusterSnapshot.of([shared_node("b", 0, 0)]))
    assert (empty.idle_milli, empty.fragmented_milli) == (2000, 0)
    assert shared_fragmentation(make_cluster([8])) == SharedFragmentation()


def test_idle_gpu_memory_next_to_too_little_cpu_is_fragmented() -> None:
    """The running shared workers ask 4 CPUs: a node with 2 left strands its idle GPUs."""
    starved = replace(
        shared_node("a", 0, 0),
        allocatable=MappingProxyType({"cpu": 8000}),
        requested=MappingProxyType({"cpu": 6000}),
    )
    running = [SharedShape(20_000, 4000)]
    result = shared_fragmentation(ClusterSnapshot.of([starved]), running)
    assert (result.idle_milli, result.fragmented_milli) == (2000, pytest.approx(2000 * 0.25))
    roomy = replace(starved, requested=MappingProxyType({"cpu": 0}))
    assert shared_fragmentation(ClusterSnapshot.of([roomy]), running).fragmented_milli == 0


def test_the_collector_serves_what_the_placer_published() -> None:
    registry = CollectorRegistry()
    gauges = PlacementGauges(clock=lambda: 1000.0)
    registry.register(gauges)
    gauges.state = PlacementState(
        waiting=(("ns", "big", "NeverFits", 900.0), ("ns", "b", "NeverFits", 990.0)),
        gpus=(DomainGpus("rack", "rack-0", "free", 4),),
        shared=SharedFragmentation(2, 300, 120.5),
    )
    text = generate_latest(registry).decode()
    assert 'trainwave_gangs_waiting_by_reason{reason="NeverFits"} 2.0' in text
    assert (
        'trainwave_gang_waiting_seconds{job_name="big",job_namespace="ns",reason="NeverFits"}'
        " 100.0" in text
    )
    assert 'trainwave_gpus{domain="rack-0",level="rack",state="free"} 4.0' in text
    assert "trainwave_shared_gpu_fragmented_milli 120.5" in text
