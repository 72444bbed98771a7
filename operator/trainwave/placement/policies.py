"""Trainwave's packing policy (experimental knobs while measuring)."""

from __future__ import annotations

from dataclasses import dataclass, field

from trainwave.placement.fragmentation import MILLI, FragmentationMeasure
from trainwave.placement.packing import Memo, NodeState, Ranked, Task, default_gpus, fgd_score, take


@dataclass(frozen=True)
class Trainwave:
    measure: FragmentationMeasure
    quantize: bool = True
    tie: str = "name"  # name | used | bestfit | fullgpus
    gpu_choice: str = "fgd"  # fgd | exact
    name: str = "trainwave"
    memo: Memo = field(default_factory=dict, repr=False, compare=False)

    def _primary(self, before: float, after: float) -> float:
        return float(fgd_score(before, after)) if self.quantize else before - after

    def rank(self, node: NodeState, task: Task) -> Ranked:
        frag = self.measure.of
        before = frag(node.gpu_model, node.cpu_free, node.gpu_free)
        cpu = node.cpu_free - task.cpu_milli
        if task.shared:
            best: tuple[float, ...] = ()
            gpus: tuple[int, ...] = ()
            for i, free in enumerate(node.gpu_free):
                if free >= task.gpu_milli:
                    after_gpus = take(node.gpu_free, (i,), task.gpu_milli)
                    after = frag(node.gpu_model, cpu, after_gpus)
                    if self.gpu_choice == "fgd":
                        key: tuple[float, ...] = (float(fgd_score(before, after)),)
                    else:
                        key = (before - after, -float(free))
                    if not best or key > best:
                        best, gpus, best_after, best_left = key, (i,), after, after_gpus
            primary = self._primary(before, best_after)
            return (primary, *self._secondary(node, task, best_left)), gpus
        gpus = default_gpus(node.gpu_free, task)
        left = take(node.gpu_free, gpus, task.gpu_milli)
        primary = self._primary(before, frag(node.gpu_model, cpu, left))
        return (primary, *self._secondary(node, task, left)), gpus

    def _secondary(self, node: NodeState, task: Task, left: tuple[int, ...]) -> tuple[float, ...]:
        if self.tie == "used":
            return (float(sum(left) < len(left) * MILLI),)
        if self.tie == "bestfit":
            return (-float(sum(left)), -float(node.cpu_free - task.cpu_milli))
        if self.tie == "fullgpus":
            return (-float(sum(1 for g in left if g == MILLI)),)
        return ()
