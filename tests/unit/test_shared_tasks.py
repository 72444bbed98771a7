"""Shared workers as packing tasks with their pods' real CPU and memory (shared_tasks.py)."""

from __future__ import annotations

import random
from dataclasses import replace
from types import MappingProxyType

import pytest
from factories import make_job

from trainwave import contract
from trainwave.builders.pods import build_worker_pods
from trainwave.placement.filters import check
from trainwave.placement.gang_types import GangRequest
from trainwave.placement.packing import fits
from trainwave.placement.records import SharedGpu
from trainwave.placement.requirements import PodNeeds, pod_needs
from trainwave.placement.shared_tasks import (
    UNTRACKED,
    SharedShape,
    free_cpu_memory,
    worker_task,
)
from trainwave.placement.sharing import (
    Pin,
    SharedPlacement,
    SharedRefusal,
    _state,
    place_shared,
    place_shared_gang,
    shared_nodes,
)
from trainwave.placement.snapshot import ClusterSnapshot, NodeInfo
from trainwave.resolving import resolve_job

pytestmark = pytest.mark.timeout(20)
GPU = 81559  # MiB of one H100 80GB
GI = 2**30
MI = 2**20


def worker_pod_needs(**options: object) -> PodNeeds:
    resolved = resolve_job(make_job(workers=1, gpuSharing={"memory": "20Gi"}, **options))
    [pod] = build_worker_pods(resolved, (0,), attempt=0)
    # What RuntimeClass admission adds to the stored pod the placer reads.
    pod["spec"]["overhead"] = {"cpu": "250m", "memory": "128Mi"}
    return pod_needs(pod)


def test_a_shared_workers_task_carries_its_pods_requests_with_init_peak_and_overhead() -> None:
    """kube-scheduler's effective request: max(containers, each init container with the
    sidecars before it) plus overhead; the runtime's installer is an init container too."""
    init = {"name": "fetch", "image": "busybox", "resources": {"requests": {"cpu": "3"}}}
    needs = worker_pod_needs(
        resources={"requests": {"cpu": "2", "memory": "4Gi"}},
        runtime={},
        command=["python", "train.py"],
        template={"spec": {"initContainers": [init]}},
    )
    task = worker_task(needs, 250)
    assert (task.cpu_milli, task.memory) == (3000 + 250, 4 * GI + 128 * MI)
    assert (task.num_gpu, task.gpu_milli, task.shared) == (1, 250, True)
    small = worker_task(
        worker_pod_needs(
            resources={"requests": {"cpu": "50m", "memory": "10Mi"}},
            runtime={},
            command=["python", "train.py"],
        ),
        250,
    )
    assert (small.cpu_milli, small.memory) == (100 + 250, 64 * MI + 128 * MI), "installer peak"


def shared_info(
    name: str, used: tuple[int, ...], cpu: str = "16", requested_cpu: int = 0
) -> NodeInfo:
    gpus = tuple(SharedGpu(f"GPU-{name}-{i}", i, GPU, mib) for i, mib in enumerate(used))
    allocatable = {
        "cpu": int(cpu) * 1000,
        "memory": 64 * GI,
        "pods": 110,
        contract.SHARED_GPU_MEMORY_RESOURCE: GPU * len(used),
    }
    requested = {"cpu": requested_cpu, contract.SHARED_GPU_MEMORY_RESOURCE: sum(used)}
    return NodeInfo(
        name, {"pool": "p"}, 0, allocatable=MappingProxyType(allocatable),
        requested=MappingProxyType(requested), shared=gpus,
    )  # fmt: skip


def request(cpu: int, memory: int, mib: int = 30720, workers: int = 1) -> GangRequest:
    resources = (("cpu", cpu), ("memory", memory), (contract.SHARED_GPU_MEMORY_RESOURCE, mib))
    return GangRequest("job", workers, 0, pod=PodNeeds(requests=resources), shared_mib=mib)


def test_the_packer_refuses_a_node_whose_cpu_is_exhausted_though_its_gpu_has_room() -> None:
    # a's GPU is half used (consolidation would pick it) but only 1 CPU is left there.
    full, empty = shared_info("a", (30720, 0), requested_cpu=15000), shared_info("b", (0, 0))
    nodes = shared_nodes(ClusterSnapshot.of([full, empty]))
    pod = PodNeeds(requests=(("cpu", 2000), ("memory", GI)))
    [pin] = _placed(place_shared(nodes, 1, 30720, pod=pod))
    assert pin.node == "b"
    # The packer alone refuses it, without the filters' slots: on a only, nothing fits.
    refused = place_shared(nodes[:1], 1, 30720, pod=pod)
    assert isinstance(refused, SharedRefusal)
    # Through the operator's path, the gang lands on b too.
    placement = place_shared_gang(ClusterSnapshot.of([full, empty]), request(2000, GI))
    assert isinstance(placement, SharedPlacement)
    assert placement.nodes == ("b",)


def test_workers_of_one_gang_use_up_a_nodes_cpu_one_by_one() -> None:
    node = shared_nodes(ClusterSnapshot.of([shared_info("a", (0, 0), cpu="5")]))
    pod = PodNeeds(requests=(("cpu", 2000),))
    assert len(_placed(place_shared(node, 2, 10240, pod=pod))) == 2
    refused = place_shared(node, 3, 10240, pod=pod)
    assert isinstance(refused, SharedRefusal)
    assert "2 of 3 workers would fit" in refused.reason


def test_the_packers_cpu_and_memory_check_agrees_with_node_resources_fit() -> None:
    rng = random.Random(11)
    for _ in range(500):
        info = replace(
            shared_info("n", (0,)),
            allocatable=MappingProxyType({"cpu": rng.choice((0, 4000, 8000)), "memory": rng.choice((0, GI)), "pods": 110}),
            requested=MappingProxyType({"cpu": rng.choice((0, 3000, 9000)), "memory": rng.choice((0, GI - 1, 2 * GI))}),
        )  # fmt: skip
        wanted = tuple(
            (name, amount)
            for name, amount in (("cpu", rng.choice((0, 1000, 5000))), ("memory", rng.choice((0, 1, GI))))
            if amount
        )  # fmt: skip
        needs = PodNeeds(requests=wanted)
        [node] = shared_nodes(ClusterSnapshot.of([info]))
        packer = fits(_state(node), worker_task(needs, 100))
        filters = not any(r.resource in ("cpu", "memory") for r in check(needs, info))
        assert packer == filters, (info.allocatable, info.requested, wanted)


def test_cpu_a_node_would_run_out_of_steers_the_fragmentation_gradient() -> None:
    """With real shapes the measure sees that a's GPU memory would be stranded next to
    1 CPU (the running workers ask 1 and 2); without CPU the gradient ties and
    consolidation picks the started node a."""
    a, b = shared_info("a", (30720, 0), requested_cpu=13000), shared_info("b", (0, 0))
    nodes = shared_nodes(ClusterSnapshot.of([a, b]))
    running = [SharedShape(30720, 1000)]
    pod = PodNeeds(requests=(("cpu", 2000), ("memory", GI)))
    [real] = _placed(place_shared(nodes, 1, 30720, None, running, pod=pod))
    blind = [replace(n, cpu_free=UNTRACKED, memory_free=UNTRACKED) for n in nodes]
    [before] = _placed(place_shared(blind, 1, 30720, None, running))
    assert (real.node, before.node) == ("b", "a")


def test_ties_still_consolidate_on_real_shapes() -> None:
    """Plenty of CPU everywhere: the gradient ties, and the started node wins over the
    smaller name."""
    a, b = shared_info("a", (0, 0), cpu="64"), shared_info("b", (0, 40960), cpu="64")
    placement = place_shared_gang(ClusterSnapshot.of([a, b]), request(4000, 8 * GI, mib=20480))
    assert isinstance(placement, SharedPlacement)
    assert placement.pins == (Pin("b", "GPU-b-1", 20480),)


def test_free_cpu_is_clamped_at_zero_on_an_over_requested_node() -> None:
    node = shared_info("n", (0,), cpu="1", requested_cpu=3000)
    assert free_cpu_memory(node) == (0, 64 * GI)
    [shared] = shared_nodes(ClusterSnapshot.of([node]))
    assert _placed(place_shared([shared], 1, 1024, pod=PodNeeds(requests=(("memory", 1),))))


def _placed(result: tuple[Pin, ...] | SharedRefusal) -> tuple[Pin, ...]:
    assert not isinstance(result, SharedRefusal), result
    return result
