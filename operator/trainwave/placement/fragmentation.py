"""GPU fragmentation of a node, measured against the task shapes a cluster usually sees. Pure.

The measure is the one of FGD (Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing
Workloads with Fragmentation Gradient Descent", USENIX ATC'23). A node's fragmentation is the
idle milli-GPU that the next task, drawn from the "typical" shapes, could not use:

    F(node) = sum over typical shapes m of  p_m * f(node, m)

    f(node, m) = all idle milli-GPU on the node    if m cannot run there (GPU model refused,
                                                   too little CPU, too few GPUs with room,
                                                   or m needs no GPU at all);
               = idle milli-GPU on the GPUs that   otherwise.
                 have less free than m asks for

Typical shapes are the most frequent (cpu, milli-GPU, GPU count, GPU models) combinations whose
counts first reach `coverage` (95%) of all tasks, CPU-only tasks included; their weights p_m are
renormalised to sum to 1. Memory is not part of a shape: the paper's measure ignores it.

Invariants: F is in milli-GPU, 0 <= F <= idle milli-GPU of the node, and F depends only on the
GPU model, the free CPU and the multiset of free milli-GPU per GPU (not on GPU order), which is
what lets `FragmentationMeasure` memoise it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

MILLI = 1000


@dataclass(frozen=True, slots=True, order=True)
class Shape:
    """What fragmentation sees of a task: CPU, milli-GPU per GPU, GPU count, allowed GPU models.

    `gpu_spec` is the allowed models joined by "|" in sorted order ("" = any model), so that
    shapes sort the way the reference simulator sorts them (by cpu, milli-GPU, count, spec).
    """

    cpu_milli: int
    gpu_milli: int
    num_gpu: int
    gpu_spec: str = ""

    @property
    def models(self) -> frozenset[str]:
        return frozenset(m for m in self.gpu_spec.split("|") if m)

    def accepts(self, gpu_model: str) -> bool:
        allowed = self.models
        return not allowed or gpu_model in allowed


@dataclass(frozen=True, slots=True)
class TypicalShapes:
    """Shapes with their weights (summing to 1), most frequent first."""

    weighted: tuple[tuple[Shape, float], ...]

    def __post_init__(self) -> None:
        if not self.weighted:
            raise ValueError("typical shapes: need at least one shape, got none")
        total = sum(w for _, w in self.weighted)
        if abs(total - 1.0) > 1e-6 or any(w <= 0 for _, w in self.weighted):
            raise ValueError(f"typical shapes: weights must be > 0 and sum to 1, got {total}")


def typical_shapes(shapes: Iterable[Shape], coverage: float = 0.95) -> TypicalShapes:
    """The most frequent shapes until their counts reach `coverage` of all; weights renormalised.

    Equal counts are ordered the way the reference simulator orders them (larger shape first),
    which only matters for which shape closes the 95% and for float summation order.
    """
    if not 0 < coverage <= 1:
        raise ValueError(f"coverage must be in (0, 1], got {coverage}")
    counts = Counter(shapes)
    if not counts:
        raise ValueError("typical shapes: the task list is empty")
    total = sum(counts.values())
    ranked = sorted(counts.items(), key=lambda item: (item[1], item[0]), reverse=True)
    chosen: list[tuple[Shape, int]] = []
    cumulative = 0
    for shape, count in ranked:
        if cumulative >= coverage * total:
            break
        chosen.append((shape, count))
        cumulative += count
    return TypicalShapes(tuple((shape, count / cumulative) for shape, count in chosen))


@dataclass(frozen=True, slots=True)
class _ModelTable:
    """The typical shapes as seen by one GPU model, pre-split for a fast F."""

    always: float  # weight of shapes that never fit this model (CPU-only or model refused)
    gpu_shapes: tuple[tuple[int, int, int, float], ...]  # (cpu, milli-GPU, GPU count, weight)


@dataclass(frozen=True)
class FragmentationMeasure:
    """F(node) for one set of typical shapes, memoised (a pure function of its key)."""

    typical: TypicalShapes
    _tables: dict[str, _ModelTable] = field(default_factory=dict, repr=False, compare=False)
    _memo: dict[tuple[str, int, tuple[int, ...]], float] = field(
        default_factory=dict, repr=False, compare=False
    )

    def of(self, gpu_model: str, cpu_free: int, gpu_free: tuple[int, ...]) -> float:
        """F in milli-GPU for a node of `gpu_model` with this free CPU and free milli-GPU."""
        key = (gpu_model, cpu_free, tuple(sorted(gpu_free)))
        value = self._memo.get(key)
        if value is None:
            value = self._memo[key] = self._compute(gpu_model, cpu_free, key[2])
        return value

    def _table(self, gpu_model: str) -> _ModelTable:
        table = self._tables.get(gpu_model)
        if table is None:
            always = 0.0
            gpu_shapes: list[tuple[int, int, int, float]] = []
            for shape, weight in self.typical.weighted:
                if shape.gpu_milli == 0 or not shape.accepts(gpu_model):
                    always += weight
                else:
                    gpu_shapes.append((shape.cpu_milli, shape.gpu_milli, shape.num_gpu, weight))
            table = self._tables[gpu_model] = _ModelTable(always, tuple(gpu_shapes))
        return table

    def _compute(self, gpu_model: str, cpu_free: int, gpus: tuple[int, ...]) -> float:
        idle = sum(gpus)
        if idle == 0:
            return 0.0
        table = self._table(gpu_model)
        frag = table.always * idle
        for cpu, milli, count, weight in table.gpu_shapes:
            if cpu_free < cpu:
                frag += weight * idle
                continue
            roomy = 0
            stranded = 0
            for free in gpus:
                if free >= milli:
                    roomy += 1
                else:
                    stranded += free
            frag += weight * (idle if roomy < count else stranded)
        return frag
