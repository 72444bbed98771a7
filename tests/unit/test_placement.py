"""Gang placement: all or nothing, tight, best fit, rank order, parallelism, explanations."""

from __future__ import annotations

import random

import pytest
from placement_factories import (
    H100,
    make_cluster,
    make_node,
    make_request,
    nvl_topology,
    placed,
    refused,
    topology_snapshot,
)

from trainwave.contract import NODE_LABEL_GPU_PRODUCT, NODE_LABEL_RACK
from trainwave.placement.gang import place
from trainwave.placement.gang_types import Blocker, GangRequest, Placement
from trainwave.placement.ranks import (
    Coordinates,
    Parallelism,
    coordinates,
    model_parallel_groups,
    neighbour_breaks,
    pipeline_groups,
    tensor_groups,
)
from trainwave.placement.snapshot import ClusterSnapshot

pytestmark = pytest.mark.timeout(10)

FULL = [8, 8, 8, 8]


def worker_groups(placement: Placement, ranks: tuple[range, ...]) -> list[set[int]]:
    """The worker ranks each group of GPU ranks runs on."""
    return [{rank // placement.gpus_per_worker for rank in group} for group in ranks]


def domains_of(snapshot: ClusterSnapshot, nodes: list[str], level: int) -> set[int]:
    topology = snapshot.topology
    return {topology.node_domains[level][topology.node_index[name]] for name in nodes}


# (cluster, request, expected worker -> node list). One row per tie-break rule.
TIGHT = [
    pytest.param(make_cluster(FULL, FULL), make_request(4),
                 ["r0-n0", "r0-n1", "r0-n2", "r0-n3"], id="one-rack-when-it-fits"),
    pytest.param(make_cluster(FULL, [8, 8, 0, 0], [8, 8, 8, 0]), make_request(2),
                 ["r1-n0", "r1-n1"], id="best-fit-rack"),
    pytest.param(make_cluster([4, 4, 4, 4], [8, 8, 0, 0]), make_request(2),
                 ["r1-n0", "r1-n1"], id="fragmented-rack-has-no-whole-worker"),
    pytest.param(make_cluster(FULL, FULL, [8, 8], [8]), make_request(5),
                 ["r0-n0", "r0-n1", "r0-n2", "r0-n3", "r3-n0"],
                 id="fewest-racks-then-best-fit-for-the-rest"),
    pytest.param(make_cluster([2, 2, 2, 2, 8]), make_request(4, 2),
                 ["r0-n4"] * 4, id="small-workers-share-one-node"),
    pytest.param(make_cluster([8, 6, 4, 8]), make_request(1, 4),
                 ["r0-n2"], id="smallest-hole-that-fits"),
    pytest.param(make_cluster([8, 8], [8, 8], [8, 8], [0, 0], spines=[2, 2]), make_request(2),
                 ["r2-n0", "r2-n1"], id="fullest-spine-on-ties"),
    pytest.param(make_cluster([8, 8], [8, 8], [8, 8], [8, 8], FULL, FULL, FULL, spines=[4, 3]),
                 make_request(8), ["r4-n0", "r4-n1", "r4-n2", "r4-n3",
                                   "r5-n0", "r5-n1", "r5-n2", "r5-n3"],
                 id="fewer-racks-beat-best-fit-spine"),
    pytest.param(make_cluster([8, 8, 4, 8]), make_request(3, 4),
                 ["r0-n0", "r0-n0", "r0-n2"], id="the-rest-goes-to-a-partly-used-node"),
]  # fmt: skip


@pytest.mark.parametrize(("snapshot", "request_", "nodes"), TIGHT)
def test_tight_placement(
    snapshot: ClusterSnapshot, request_: GangRequest, nodes: list[str]
) -> None:
    assert list(placed(place(snapshot, request_)).nodes) == nodes


def test_partially_used_node_beats_an_empty_one_of_the_same_free_size() -> None:
    nodes = [make_node("a", gpus=4, free=4), make_node("b", gpus=8, free=4)]
    assert placed(place(ClusterSnapshot.of(nodes), make_request(1, 4))).nodes == ("b",)


@pytest.mark.parametrize(
    ("snapshot", "request_"),
    [
        pytest.param(make_cluster(FULL, [8, 8, 0, 0]), make_request(7), id="one-short"),
        pytest.param(make_cluster([4] * 8), make_request(2), id="gpus-free-but-scattered"),
        pytest.param(make_cluster(FULL), make_request(1, 16), id="worker-larger-than-node"),
    ],
)
def test_all_or_nothing(snapshot: ClusterSnapshot, request_: GangRequest) -> None:
    refused(place(snapshot, request_))


@pytest.mark.parametrize("workers", [1, 3, 6, 12, 20, 33, 64])
def test_every_worker_gets_whole_free_gpus(workers: int) -> None:
    snapshot = make_cluster(*[[8, 4, 0, 8, 8, 2] * 2] * 8, spines=[4, 4])
    placement = placed(place(snapshot, make_request(workers, 2)))
    assert len(placement.nodes) == workers
    for node, gpus in placement.gpus_by_node().items():
        assert gpus <= snapshot.node(node).free


@pytest.mark.parametrize(
    ("level", "workers", "preferred_met", "racks"),
    [
        pytest.param(None, 4, True, ["rack-0"], id="preferred-met"),
        pytest.param(None, 6, False, ["rack-0", "rack-1"], id="preferred-spills-over"),
        pytest.param("rack", 4, True, ["rack-0"], id="required-met"),
        pytest.param(NODE_LABEL_RACK, 4, True, ["rack-0"], id="required-by-label"),
        pytest.param("spine", 6, False, ["rack-0", "rack-1"], id="required-spine"),
    ],
)
def test_required_and_preferred_levels(
    level: str | None, workers: int, preferred_met: bool, racks: list[str]
) -> None:
    snapshot = make_cluster(FULL, FULL)
    request = make_request(workers, required_level=level, preferred_level="rack")
    placement = placed(place(snapshot, request))
    assert placement.preferred_met is preferred_met
    assert list(placement.domains("rack")) == racks


def test_no_preferred_level_reports_none() -> None:
    assert placed(place(make_cluster(FULL), make_request(1))).preferred_met is None


def test_a_gang_spread_over_racks_says_how_much_room_the_roomiest_rack_had() -> None:
    # rack-1 has the most whole-worker room (3 nodes free), rack-0 the fewest.
    snapshot = make_cluster([8, 8, 0, 0], [8, 8, 8, 0])
    placement = placed(place(snapshot, make_request(5, preferred_level="rack")))
    assert placement.preferred_met is False
    assert placement.describe().endswith("; no rack had room for 5 workers (roomiest: rack-1, 3)")
    one_rack = placed(place(snapshot, make_request(3, preferred_level="rack")))
    assert one_rack.preferred_room is None
    assert "room" not in one_rack.describe()


def test_required_node_keeps_small_workers_together() -> None:
    placement = placed(place(make_cluster([4, 8]), make_request(2, 4, required_level="node")))
    assert placement.nodes == ("r0-n1", "r0-n1")


# (cluster, request, code, exact sentence): every "no" says what is needed and what is there.
EXPLAINED = [
    pytest.param(make_cluster(FULL, FULL), make_request(5, required_level="rack"),
                 Blocker.REQUIRED_LEVEL,
                 "needs 40 GPUs (5 workers x 8) within one rack; the roomiest rack, rack-0, "
                 "has room for 4 such workers (32 GPUs free)", id="rack-too-small"),
    pytest.param(make_cluster([8, 8], [8, 4]), make_request(2, required_level="node"),
                 Blocker.REQUIRED_LEVEL,
                 "needs 16 GPUs (2 workers x 8) within one node; the roomiest node, r0-n0, "
                 "has room for 1 such worker (8 GPUs free)", id="node-too-small"),
    pytest.param(make_cluster([8, 8], [8, 0]), make_request(4), Blocker.NOT_ENOUGH_GPUS,
                 "needs 32 GPUs (4 workers x 8); the free GPUs have room for 3 such workers "
                 "(24 GPUs free); 3/4 nodes fit a worker: 1 too few free nvidia.com/gpu "
                 "(needs 8, largest free 0)", id="not-enough"),
    pytest.param(make_cluster([4, 4, 4], [4]), make_request(2), Blocker.NOT_ENOUGH_GPUS,
                 "needs 16 GPUs (2 workers x 8); the free GPUs have room for 0 such workers "
                 "(16 GPUs free, some in pieces under 8); 0/4 nodes fit a worker: 4 too few "
                 "free nvidia.com/gpu "
                 "(needs 8, largest free 4)", id="fragmented"),
    pytest.param(make_cluster(FULL), make_request(1, 16), Blocker.WORKER_TOO_LARGE,
                 "each worker needs 16 GPUs, but the largest node has 8", id="worker-too-large"),
    pytest.param(make_cluster(FULL), make_request(1, node_selector={NODE_LABEL_GPU_PRODUCT: "B200"}),
                 Blocker.NO_MATCHING_NODES,
                 "no node matching gpu.product=B200 can take a worker: 0/4 nodes fit a "
                 "worker: 4 not matching gpu.product=B200", id="no-match"),
    pytest.param(make_cluster(FULL), make_request(2, tensor=16), Blocker.PARALLELISM,
                 "each tensor-parallel group of 16 GPUs (2 workers) must sit in one node; "
                 "the free ones hold 0 such groups, 1 needed", id="tensor-needs-nvlink"),
    pytest.param(make_cluster([8, 4, 4]), make_request(4, 4, tensor=8), Blocker.PARALLELISM,
                 "each tensor-parallel group of 8 GPUs (2 workers) must sit in one node; "
                 "the free ones hold 1 such group, 2 needed", id="tensor-split-nodes"),
    pytest.param(make_cluster([8] * 3, [8] * 3, [8] * 3), make_request(8, tensor=8, pipeline=4),
                 Blocker.PARALLELISM,
                 "each model replica (4 pipeline stages x 8 GPUs, 4 workers) must sit in one "
                 "rack; the free ones hold 0 such replicas, 2 needed", id="replica-needs-rack"),
    pytest.param(make_cluster(FULL), make_request(3, tensor=3), Blocker.INVALID_REQUEST,
                 "a tensor-parallel group spans 3 GPUs, which neither fills whole workers of "
                 "8 GPUs nor divides one", id="tensor-misaligned"),
    pytest.param(make_cluster(FULL), make_request(2, tensor=8, pipeline=3), Blocker.INVALID_REQUEST,
                 "tensor 8 x pipeline 3 = 24 GPUs per model replica does not divide the job's "
                 "16 GPUs (2 workers x 8)", id="replica-misaligned"),
    pytest.param(make_cluster(FULL), make_request(0), Blocker.INVALID_REQUEST,
                 "workers must be at least 1 and GPUs per worker at least 0", id="no-workers"),
    pytest.param(make_cluster(FULL), make_request(1, required_level="zone"),
                 Blocker.INVALID_REQUEST,
                 "required level 'zone' is not a topology level; the levels are: spine, rack, "
                 "node", id="unknown-level"),
]  # fmt: skip


@pytest.mark.parametrize(("snapshot", "request_", "code", "reason"), EXPLAINED)
def test_every_no_is_explained(
    snapshot: ClusterSnapshot, request_: GangRequest, code: Blocker, reason: str
) -> None:
    result = refused(place(snapshot, request_))
    assert (result.code, result.reason) == (code, reason)


def test_data_degree_must_match() -> None:
    request = GangRequest("job", 2, 8, parallelism=Parallelism(tensor=8, data=4))
    assert (
        "x data 4 = 32 GPUs, but the job has 16"
        in refused(place(make_cluster(FULL), request)).reason
    )


def test_tensor_groups_stay_inside_one_nvlink_domain() -> None:
    # Two NVLink domains of 4 nodes with 3 free each: plain order would put ranks 0-2 in the
    # first and 3 in the second, splitting the second tensor group across domains.
    snapshot = nvl_topology(racks=1, nodes=8, per_domain=4)
    names = snapshot.topology.node_names
    snapshot = snapshot.with_usage({names[3]: 4, names[7]: 4})
    plain = placed(place(snapshot, make_request(4, 4)))
    assert len(domains_of(snapshot, list(plain.nodes[2:4]), level=3)) == 2
    placement = placed(place(snapshot, make_request(4, 4, tensor=8)))
    for workers in worker_groups(placement, tensor_groups(16, Parallelism(tensor=8))):
        assert len(domains_of(snapshot, [placement.nodes[w] for w in workers], level=3)) == 1


def test_model_replicas_stay_inside_one_rack() -> None:
    snapshot = make_cluster([8] * 6, [8] * 6)
    plain = placed(place(snapshot, make_request(8)))
    assert [sum(n.startswith(f"r{r}-") for n in plain.nodes) for r in (0, 1)] == [6, 2]
    parallelism = Parallelism(tensor=8, pipeline=4)
    placement = placed(place(snapshot, make_request(8, tensor=8, pipeline=4)))
    assert [sum(n.startswith(f"r{r}-") for n in placement.nodes) for r in (0, 1)] == [4, 4]
    for workers in worker_groups(placement, model_parallel_groups(64, parallelism)):
        assert len(domains_of(snapshot, [placement.nodes[w] for w in workers], level=2)) == 1


def test_small_tensor_groups_pair_workers_on_one_node() -> None:
    placement = placed(place(make_cluster([8, 8, 4]), make_request(4, 4, tensor=8)))
    assert placement.nodes == ("r0-n0", "r0-n0", "r0-n1", "r0-n1")


def test_rank_layout_is_tensor_then_pipeline_then_data() -> None:
    parallelism = Parallelism(tensor=2, pipeline=3)
    assert coordinates(7, parallelism) == Coordinates(tensor=1, pipeline=0, data=1)
    assert [tuple(group) for group in tensor_groups(12, parallelism)][:2] == [(0, 1), (2, 3)]
    assert [tuple(g) for g in model_parallel_groups(12, parallelism)] == [
        tuple(range(6)),
        tuple(range(6, 12)),
    ]
    assert pipeline_groups(12, parallelism)[:3] == ((0, 2, 4), (1, 3, 5), (6, 8, 10))


def fragmented_large(seed: int) -> ClusterSnapshot:
    """The 1,024-node topology with a random third of its GPUs in use."""
    snapshot = topology_snapshot("large")
    rng = random.Random(seed)
    return snapshot.with_usage(
        {n: rng.choice([0, 0, 2, 4, 8]) for n in snapshot.topology.node_names}
    )


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_consecutive_ranks_are_neighbours_on_the_large_topology(seed: int) -> None:
    snapshot = fragmented_large(seed)
    topology = snapshot.topology
    for workers, gpus in ((6, 8), (24, 8), (70, 8), (40, 2), (300, 8)):
        placement = placed(place(snapshot, make_request(workers, gpus)))
        for level, name in ((1, "spine"), (2, "rack"), (3, "node")):
            used = len(placement.domains(name))
            assert neighbour_breaks(topology, placement.nodes, level) == used - 1, (workers, name)


def fragmented_nvl(seed: int) -> ClusterSnapshot:
    """Eight GB200-like racks of 16 nodes x 4 GPUs, NVLink domains of 4 nodes, a third busy."""
    snapshot = nvl_topology(racks=8, nodes=16, per_domain=4)
    rng = random.Random(seed)
    return snapshot.with_usage(
        {n: rng.choice([0, 0, 1, 2, 4]) for n in snapshot.topology.node_names}
    )


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("cluster", [fragmented_large, fragmented_nvl], ids=["hgx", "nvl"])
def test_invariants_hold_for_random_requests(seed: int, cluster: object) -> None:
    rng = random.Random(seed)
    snapshot = cluster(seed)  # type: ignore[operator]
    topology = snapshot.topology
    nvlink = topology.node_level if topology.nvlink_level is None else topology.nvlink_level
    placements = 0
    largest = max(node.gpus for node in snapshot.nodes)
    for _ in range(30):
        gpus = rng.choice([g for g in (1, 2, 4, 8) if g <= largest])
        tensor = rng.choice([None, gpus, 8, 16])
        workers = rng.choice([1, 2, 4, 8, 16, 32])
        level = rng.choice([None, "node", "rack", "spine"])
        request = make_request(workers, gpus, tensor=tensor, pipeline=rng.choice([None, 2]),
                               required_level=level)  # fmt: skip
        result = place(snapshot, request)
        if not isinstance(result, Placement):
            continue
        placements += 1
        assert len(result.nodes) == workers
        for node, used in result.gpus_by_node().items():
            assert used <= snapshot.node(node).free
        if level is not None:
            assert len(result.domains(level)) == 1
        if request.parallelism is not None:
            world = workers * gpus
            checks = ((model_parallel_groups, topology.pipeline_level), (tensor_groups, nvlink))
            for groups, at in checks:
                for ranks in worker_groups(result, groups(world, request.parallelism)):
                    assert len(domains_of(snapshot, [result.nodes[w] for w in ranks], at)) == 1
        snapshot = snapshot.with_usage(result.gpus_by_node())
    assert placements >= 8  # not vacuous: most seeds place half


def test_same_input_same_answer_whatever_the_node_order() -> None:
    nodes = list(make_cluster(FULL, [8, 8, 4, 0], FULL, spines=[2, 1]).nodes)
    first = place(ClusterSnapshot.of(nodes), make_request(6))
    random.Random(5).shuffle(nodes)
    assert place(ClusterSnapshot.of(nodes), make_request(6)) == first


def test_node_selector_limits_the_nodes() -> None:
    nodes = [make_node(f"n{i}", labels={NODE_LABEL_GPU_PRODUCT: H100 if i % 2 else "A100"})
             for i in range(4)]  # fmt: skip
    request = make_request(2, node_selector={NODE_LABEL_GPU_PRODUCT: H100})
    assert placed(place(ClusterSnapshot.of(nodes), request)).nodes == ("n1", "n3")


def test_describe_summarises_the_domains() -> None:
    placement = placed(place(make_cluster(FULL, FULL, spines=[1, 1]), make_request(6)))
    assert placement.describe() == (
        "6 workers x 8 GPUs on 6 nodes, 2 racks (rack-0, rack-1), 2 spines (spine-0, spine-1)"
    )


def test_a_gang_is_never_spread_when_one_rack_has_room_for_it() -> None:
    """The invariant the constraint benchmark measures from outside, checked exactly on 500
    seeded random fills of 4 racks x 8 nodes."""
    rng = random.Random(2026)
    for _ in range(500):
        frees = [[rng.choice([0, 1, 2, 4, 6, 8]) for _ in range(8)] for _ in range(4)]
        workers, gpus = rng.randint(2, 8), rng.choice([1, 2, 4, 8])
        room = max(sum(f // gpus for f in rack) for rack in frees)
        result = place(make_cluster(*frees), make_request(workers, gpus, preferred_level="rack"))
        if room >= workers:
            assert placed(result).preferred_met, (frees, workers, gpus)
