"""Which gradient communication strategies `auto` should try: a pure cost model.

Pure: no torch, no I/O. Given the link rates the operator measured or declared
(TRAINWAVE_INTER_NODE_GBPS / TRAINWAVE_INTRA_NODE_GBPS), the gang's shape and the
gradient, estimate the seconds one gradient allreduce takes under each strategy.
`auto` uses the estimates to prune (trials.py) and then times the survivors on
the live model: on a busy CPU this model ranked near-ties wrongly and
underestimated PowerSGD's cost 3-7x (bench_comm), so it no longer decides alone.

The model (alpha-beta per bucket, no overlap with compute; on a CPU the bytes
every rank reduces, copies and casts cost as much as the wire, so they count):
- flat ring over N = nodes x local ranks, ranks numbered node by node: every ring
  edge carries 2(N-1)/N of the gradient, and the slowest edge sets the pace.
- hierarchical: reduce-scatter inside the node, `local` allreduces of 1/local of
  the gradient across nodes that share the node's link (together 2(n-1)/n of the
  gradient through it), all-gather inside the node.
- fp16/bf16: half the bytes, plus two passes over the gradient to cast.
- PowerSGD (rank r): each m x n matrix sends r(m+n) numbers; vectors go
  uncompressed; costs two small matmuls per matrix and a few passes of memory.
Lossy strategies (fp16, bf16, PowerSGD) change the numbers the optimizer sees,
so they must beat the best exact strategy by `lossy_margin` to be chosen.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

STRATEGIES = ("flat", "hierarchical", "fp16", "hierarchical+fp16", "powersgd")
EXACT = frozenset({"flat", "hierarchical"})


@dataclass(frozen=True)
class DeviceCosts:
    """How fast the device does the work compression adds (measured or defaulted)."""

    cast_gbytes_per_s: float  # elementwise dtype conversion, bytes read per second
    matmul_gflops: float  # dense fp32 matmul throughput
    collective_latency_s: float  # fixed cost of one collective step (alpha)
    # Bytes a rank reduces or copies per second while a collective runs; on a GPU
    # this is HBM and negligible, on a CPU it competes with the training itself.
    memory_gbytes_per_s: float = 1e4

    def __post_init__(self) -> None:
        for name in ("cast_gbytes_per_s", "matmul_gflops", "memory_gbytes_per_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"DeviceCosts.{name} must be > 0, got {getattr(self, name)}")
        if self.collective_latency_s < 0:
            raise ValueError(
                f"DeviceCosts.collective_latency_s must be >= 0, got {self.collective_latency_s}"
            )


# Order-of-magnitude defaults for when nothing was measured. A CUDA device casts
# and multiplies two to three orders of magnitude faster than a CPU core.
CUDA_COSTS = DeviceCosts(500.0, 20_000.0, 2e-5, memory_gbytes_per_s=1000.0)
CPU_COSTS = DeviceCosts(2.0, 20.0, 2e-4, memory_gbytes_per_s=2.0)


@dataclass(frozen=True)
class CommProblem:
    """One gang's gradient exchange: its shape, its links and its gradient."""

    nodes: int
    local_world_size: int
    inter_node_gbps: float
    intra_node_gbps: float
    # Shapes of the gradients (one per parameter); bytes per element.
    shapes: Sequence[tuple[int, ...]]
    element_bytes: int = 4
    powersgd_rank: int = 1
    buckets: int = 1  # DDP buckets: each pays every collective's latency

    def __post_init__(self) -> None:
        for name in ("nodes", "local_world_size", "element_bytes", "powersgd_rank", "buckets"):
            if getattr(self, name) < 1:
                raise ValueError(f"CommProblem.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("inter_node_gbps", "intra_node_gbps"):
            if not getattr(self, name) > 0:
                raise ValueError(
                    f"CommProblem.{name} must be > 0 Gbit/s, got {getattr(self, name)}; "
                    "set it from the link's measured or nominal rate"
                )

    @property
    def world_size(self) -> int:
        return self.nodes * self.local_world_size

    @property
    def grad_bytes(self) -> int:
        return sum(math.prod(s) for s in self.shapes) * self.element_bytes


@dataclass(frozen=True)
class Choice:
    """The pick, and every estimate it was picked from (seconds per allreduce)."""

    strategy: str
    estimates: dict[str, float] = field(default_factory=dict)
    reason: str = ""

    @property
    def hierarchical(self) -> bool:
        return self.strategy.startswith("hierarchical")

    @property
    def compression(self) -> str:
        """The compression mode name (contract.COMPRESSION_MODES) this choice implies."""
        if self.strategy.endswith("fp16"):
            return "fp16"
        return "powersgd" if self.strategy == "powersgd" else "off"


def _seconds(nbytes: float, gbps: float) -> float:
    return nbytes * 8 / (gbps * 1e9)


def _host_seconds(nbytes: float, costs: DeviceCosts) -> float:
    return nbytes / (costs.memory_gbytes_per_s * 1e9)


def flat_seconds(p: CommProblem, costs: DeviceCosts, nbytes: float | None = None) -> float:
    """Ring allreduce over every rank; the slowest edge (usually the inter-node one) paces it."""
    b = p.grad_bytes if nbytes is None else nbytes
    n = p.world_size
    if n == 1:
        return 0.0
    rates = [p.inter_node_gbps] if p.nodes > 1 else []
    rates += [p.intra_node_gbps] if p.local_world_size > 1 else []
    moved = 2 * (n - 1) / n * b  # through every ring edge, and reduced or copied by every rank
    latency = p.buckets * 2 * (n - 1) * costs.collective_latency_s
    return _seconds(moved, min(rates)) + _host_seconds(moved, costs) + latency


def hierarchical_seconds(p: CommProblem, costs: DeviceCosts, nbytes: float | None = None) -> float:
    """Reduce-scatter in the node, allreduce across nodes, all-gather in the node."""
    b = p.grad_bytes if nbytes is None else nbytes
    local, nodes = p.local_world_size, p.nodes
    intra = 2 * (local - 1) / local * b
    inter = 2 * (nodes - 1) / nodes * b  # local parallel rings share the node's link
    steps = 2 * (local - 1) + 2 * (nodes - 1)
    # Each rank copies into and out of the padded buffer and reduces its own slice.
    host = 2 * b + intra + inter / local
    return (
        _seconds(intra, p.intra_node_gbps)
        + _seconds(inter, p.inter_node_gbps)
        + _host_seconds(host, costs)
        + p.buckets * steps * costs.collective_latency_s
    )


def _cast_seconds(p: CommProblem, costs: DeviceCosts) -> float:
    # Read fp32 and write fp16 on the way out, the reverse on the way back.
    return 2 * 1.5 * p.grad_bytes / (costs.cast_gbytes_per_s * 1e9)


def powersgd_bytes(p: CommProblem) -> float:
    """Numbers PowerSGD sends per step: r(m+n) per matrix, vectors as they are."""
    r, total = p.powersgd_rank, 0
    for shape in p.shapes:
        if len(shape) < 2:
            total += math.prod(shape)
            continue
        m, n = shape[0], math.prod(shape[1:])
        # torch's hook keeps a matrix uncompressed when compressing would not pay.
        total += min(r * (m + n), m * n)
    return total * p.element_bytes


def powersgd_seconds(p: CommProblem, costs: DeviceCosts) -> float:
    r = p.powersgd_rank
    flops = sum(4 * s[0] * math.prod(s[1:]) * r for s in p.shapes if len(s) >= 2)
    # Error feedback (add, subtract), copies into matrices and back, the product
    # P Q^T: about six passes over the gradient.
    memory = _host_seconds(6 * p.grad_bytes, costs)
    compute = flops / (costs.matmul_gflops * 1e9) + memory
    # Three allreduces per bucket (vectors, P, Q), each paying its latency.
    comm = flat_seconds(p, costs, powersgd_bytes(p)) + 2 * flat_seconds(p, costs, 0)
    return compute + comm


def estimate(p: CommProblem, costs: DeviceCosts) -> dict[str, float]:
    """Seconds per gradient allreduce for every strategy that applies to this gang."""
    half = p.grad_bytes / 2
    out = {"flat": flat_seconds(p, costs), "fp16": flat_seconds(p, costs, half)}
    out["fp16"] += _cast_seconds(p, costs)
    if p.nodes > 1 and p.local_world_size > 1:
        out["hierarchical"] = hierarchical_seconds(p, costs)
        out["hierarchical+fp16"] = hierarchical_seconds(p, costs, half) + _cast_seconds(p, costs)
    if any(len(s) >= 2 for s in p.shapes):
        out["powersgd"] = powersgd_seconds(p, costs)
    return out


def choose(
    p: CommProblem,
    costs: DeviceCosts,
    *,
    candidates: Collection[str] = STRATEGIES,
    lossy_margin: float = 1.25,
) -> Choice:
    """The cheapest candidate; a lossy one only if it is `lossy_margin` times faster than exact.

    `candidates` narrows the choice when the user fixed one feature and left the
    other on `auto` (compression fp16 + hierarchical auto: "fp16" or "hierarchical+fp16").
    """
    unknown = set(candidates) - set(STRATEGIES)
    if unknown:
        raise ValueError(f"unknown strategies {sorted(unknown)}; accepted: {', '.join(STRATEGIES)}")
    if p.world_size == 1:
        return Choice("flat", {"flat": 0.0}, "one process: nothing to communicate")
    est = {s: t for s, t in estimate(p, costs).items() if s in candidates}
    if not est:
        est = {"flat": flat_seconds(p, costs)}
    exact_ones = [s for s in est if s in EXACT]
    if not exact_ones:
        best = min(est, key=est.__getitem__)
        return Choice(best, est, f"{best} is the fastest of the allowed strategies")
    exact = min(exact_ones, key=est.__getitem__)
    lossy = [s for s in est if s not in EXACT]
    best_lossy = min(lossy, key=est.__getitem__) if lossy else None
    if best_lossy is not None and est[best_lossy] * lossy_margin < est[exact]:
        gain = est[exact] / est[best_lossy]
        return Choice(best_lossy, est, f"{best_lossy} is {gain:.2f}x faster than {exact}")
    why = f"{exact} is the fastest exact strategy"
    if best_lossy is not None:
        why += f"; {best_lossy} would gain {est[exact] / est[best_lossy]:.2f}x < {lossy_margin}x"
    return Choice(exact, est, why)


def bucket_cap_mb(
    grad_bytes: int, *, target_buckets: int = 8, floor: int = 1, cap: int = 64
) -> int:
    """DDP bucket size: about `target_buckets` buckets so communication overlaps backward.

    Too few buckets and the last one starts only when backward ends; too many and
    per-collective latency dominates. DDP's default (25 MB) gives a small model a
    single bucket and no overlap at all.
    """
    if grad_bytes < 0:
        raise ValueError(f"grad_bytes must be >= 0, got {grad_bytes}")
    mb = math.ceil(grad_bytes / target_buckets / 2**20)
    return max(floor, min(cap, mb))
