"""Hierarchical allreduce equals flat allreduce: 4 gloo ranks on 127.0.0.1, several layouts."""

from __future__ import annotations

import pytest
from dist_harness import run_world

from trainwave.runtime.comm.hierarchical import local_world_size_from

WORLD = 4
# id: (ranks per node, elements, values, travel dtype)
CASES = {
    "2x2-integers-exact": (2, 4097, "int", None),
    "2x2-one-element": (2, 1, "int", None),
    "2x2-odd-length-padded": (2, 7, "int", None),
    "2x2-random-floats": (2, 10_000, "randn", None),
    "1x4-one-node": (4, 1000, "int", None),
    "4x1-one-rank-per-node": (1, 1000, "int", None),
    "2x2-fp16": (2, 10_000, "randn", "fp16"),
    "2x2-bf16": (2, 10_000, "randn", "bf16"),
}
# Largest |hierarchical - flat| allowed, relative to the largest |flat| value.
TOLERANCE = {None: 0.0, "randn": 1e-6, "fp16": 2**-10, "bf16": 2**-7}


def _compare(rank: int, world: int, cases: dict) -> dict:
    import torch
    import torch.distributed as dist

    from trainwave.runtime.comm.hierarchical import build_node_groups, hierarchical_all_reduce_

    groups = {local: build_node_groups(local) for local in sorted({c[0] for c in cases.values()})}
    dtypes = {"fp16": torch.float16, "bf16": torch.bfloat16, None: None}
    out: dict = {}
    for cid, (local, numel, values, travel) in cases.items():
        gen = torch.Generator().manual_seed(1000 * rank + numel)
        if values == "int":
            x = torch.randint(-1000, 1000, (numel,), generator=gen).float()
        else:
            x = torch.randn(numel, generator=gen)
        flat = x.clone()
        dist.all_reduce(flat)
        flat /= world
        hier = hierarchical_all_reduce_(x.clone(), groups[local], compress_dtype=dtypes[travel])
        out[cid] = {
            "max_diff": float((hier - flat).abs().max()),
            "scale": float(flat.abs().max()),
            "changed": not torch.equal(hier, x),
        }
    try:
        build_node_groups(3)
    except ValueError as exc:
        out["bad-layout"] = str(exc)
    return out


@pytest.fixture(scope="module")
def results() -> list[dict]:
    return run_world(_compare, WORLD, CASES)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", list(CASES))
def test_hierarchical_equals_flat(results, case):
    _, _, values, travel = CASES[case]
    tolerance = (
        TOLERANCE[travel]
        if travel
        else (TOLERANCE[None] if values == "int" else TOLERANCE["randn"])
    )
    for rank, per_rank in enumerate(results):
        got = per_rank[case]
        assert got["changed"], f"rank {rank}: the tensor was not reduced"
        assert got["max_diff"] <= tolerance * got["scale"], (rank, got)


@pytest.mark.timeout(60)
def test_uneven_layout_is_refused_with_the_numbers(results):
    assert results[0]["bad-layout"] == (
        "local_world_size=3 must be >= 1 and divide the world size 4: "
        "hierarchical allreduce needs the same number of ranks on every node"
    )


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        pytest.param({"LOCAL_WORLD_SIZE": "8"}, 8, id="set"),
        pytest.param({}, "LOCAL_WORLD_SIZE is not set", id="missing"),
        pytest.param(
            {"LOCAL_WORLD_SIZE": "eight"},
            "LOCAL_WORLD_SIZE='eight' is not an integer",
            id="not-a-number",
        ),
        pytest.param({"LOCAL_WORLD_SIZE": "0"}, "LOCAL_WORLD_SIZE=0 must be >= 1", id="zero"),
    ],
)
def test_local_world_size_from(environ, expected):
    if isinstance(expected, int):
        assert local_world_size_from(environ) == expected
    else:
        with pytest.raises(ValueError, match=expected):
            local_world_size_from(environ)
