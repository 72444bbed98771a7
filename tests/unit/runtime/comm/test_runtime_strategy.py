"""The comm cost model behind `auto`: byte counts, crossovers, and what it refuses."""

from __future__ import annotations

import pytest

from trainwave.runtime.comm import strategy
from trainwave.runtime.comm.strategy import CommProblem, DeviceCosts

# A fast device: compression costs nearly nothing, so only the links decide.
FREE_COMPUTE = DeviceCosts(
    cast_gbytes_per_s=1e6, matmul_gflops=1e9, collective_latency_s=0.0, memory_gbytes_per_s=1e9
)
MIB = 2**20


def make_problem(
    *, nodes=2, local=2, inter=1.0, intra=100.0, shapes=((1024, 1024),), rank=1
) -> CommProblem:
    return CommProblem(
        nodes=nodes,
        local_world_size=local,
        inter_node_gbps=inter,
        intra_node_gbps=intra,
        shapes=list(shapes),
        powersgd_rank=rank,
    )


def test_flat_ring_pushes_2_n_minus_1_over_n_through_the_inter_node_link():
    p = make_problem(nodes=2, local=2, inter=8.0, intra=1e9)  # 8 Gbit/s = 1 GB/s
    seconds = strategy.flat_seconds(p, FREE_COMPUTE)
    assert seconds == pytest.approx(1.5 * 4 * MIB / 1e9)


def test_hierarchical_pushes_2_n_minus_1_over_n_of_nodes():
    p = make_problem(nodes=2, local=4, inter=8.0, intra=1e9)
    seconds = strategy.hierarchical_seconds(p, FREE_COMPUTE)
    assert seconds == pytest.approx(1.0 * 4 * MIB / 1e9, rel=1e-6)


def test_powersgd_bytes_are_r_times_m_plus_n_per_matrix():
    p = make_problem(shapes=[(1024, 512), (512,), (3, 3, 64, 64)], rank=2)
    # conv weights are matrices of shape (out, everything else) for PowerSGD.
    want = (2 * (1024 + 512) + 512 + 2 * (3 + 3 * 64 * 64)) * 4
    assert strategy.powersgd_bytes(p) == want


@pytest.mark.parametrize(
    ("problem", "costs", "expected"),
    [
        pytest.param(
            make_problem(inter=1.0, intra=1000.0),
            FREE_COMPUTE,
            "powersgd",
            id="slow-link-free-compute-powersgd",
        ),
        pytest.param(
            make_problem(inter=10.0, intra=10.0), strategy.CPU_COSTS, "flat", id="equal-links-flat"
        ),
        pytest.param(
            make_problem(inter=1.0, intra=100.0, shapes=[(4 * MIB,)]),
            FREE_COMPUTE,
            "hierarchical+fp16",
            id="vectors-only-no-powersgd",
        ),
        pytest.param(
            make_problem(nodes=1, local=8, shapes=[(4 * MIB,)]),
            FREE_COMPUTE,
            "fp16",
            id="one-node-no-hierarchical",
        ),
        pytest.param(make_problem(nodes=1, local=1), FREE_COMPUTE, "flat", id="one-process"),
    ],
)
def test_choose(problem, costs, expected):
    assert strategy.choose(problem, costs).strategy == expected


def test_latency_bound_small_messages_favour_fewer_steps():
    """On a fast link the per-step latency decides: hierarchical has fewer ring steps."""
    p = make_problem(nodes=2, local=4, inter=1000.0, intra=1000.0, shapes=[(64,)])
    latency_only = DeviceCosts(1e6, 1e9, collective_latency_s=1e-3, memory_gbytes_per_s=1e9)
    est = strategy.estimate(p, latency_only)
    assert est["hierarchical"] < est["flat"]


def test_host_copies_make_hierarchical_lose_on_a_fast_link_with_a_slow_cpu():
    """What bench_comm measured: with links no slower than memory, the detour costs."""
    p = make_problem(nodes=2, local=2, inter=10.0, intra=10.0)
    est = strategy.estimate(p, strategy.CPU_COSTS)
    assert est["hierarchical"] > est["flat"]


def test_every_bucket_pays_the_latency():
    one, eight = (make_problem(shapes=[(64,)]), CommProblem(2, 2, 1.0, 100.0, [(64,)], buckets=8))
    costs = DeviceCosts(1e6, 1e9, collective_latency_s=1e-3, memory_gbytes_per_s=1e9)
    gap = strategy.flat_seconds(eight, costs) - strategy.flat_seconds(one, costs)
    assert gap == pytest.approx(7 * 2 * 3 * 1e-3)


def test_exact_candidates_only_picks_hierarchical_on_slow_inter_node_link():
    exact = ("flat", "hierarchical")
    slow = strategy.choose(make_problem(inter=1.0, intra=100.0), FREE_COMPUTE, candidates=exact)
    fast = strategy.choose(make_problem(inter=100.0, intra=100.0), FREE_COMPUTE, candidates=exact)
    assert (slow.strategy, fast.strategy) == ("hierarchical", "flat")
    assert slow.hierarchical
    assert slow.compression == "off"


def test_lossy_must_beat_exact_by_the_margin():
    # fp16 halves bytes: exactly 2x on free compute; a 2.5x margin keeps the exact pick.
    p = make_problem(inter=1.0, intra=1e6, shapes=[(4 * MIB,)])
    assert strategy.choose(p, FREE_COMPUTE, lossy_margin=1.5).compression == "fp16"
    kept = strategy.choose(p, FREE_COMPUTE, lossy_margin=2.5)
    assert kept.compression == "off"
    assert "would gain 2.00x < 2.5x" in kept.reason


def test_slow_compute_makes_compression_lose():
    p = make_problem(inter=100.0, intra=100.0, shapes=[(4 * MIB,)])
    slow_cpu = DeviceCosts(cast_gbytes_per_s=0.5, matmul_gflops=1.0, collective_latency_s=0.0)
    assert strategy.choose(p, slow_cpu).compression == "off"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        pytest.param(
            {"inter": 0.0},
            r"CommProblem.inter_node_gbps must be > 0 Gbit/s, got 0.0",
            id="zero-link",
        ),
        pytest.param({"nodes": 0}, "CommProblem.nodes must be >= 1, got 0", id="no-nodes"),
        pytest.param({"rank": 0}, "CommProblem.powersgd_rank must be >= 1, got 0", id="rank-zero"),
    ],
)
def test_problem_rejects(kwargs, message):
    with pytest.raises(ValueError, match=message):
        make_problem(**kwargs)


def test_unknown_candidate_is_named():
    with pytest.raises(ValueError, match=r"unknown strategies \['ring'\]; accepted: flat, hier"):
        strategy.choose(make_problem(), FREE_COMPUTE, candidates=["ring"])


@pytest.mark.parametrize(
    ("grad_bytes", "expected"),
    [
        pytest.param(0, 1, id="empty-floor"),
        pytest.param(4 * MIB, 1, id="small-model-floor"),
        pytest.param(400 * MIB, 50, id="eight-buckets"),
        pytest.param(10_000 * MIB, 64, id="cap"),
    ],
)
def test_bucket_cap_mb(grad_bytes, expected):
    assert strategy.bucket_cap_mb(grad_bytes) == expected
