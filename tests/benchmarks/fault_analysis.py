"""What the fault benchmark's step logs say about each fault and the whole run. Pure.

fault_worker.py appends one record per completed step and rank: `step`, wall clock `t`,
elastic generation `gen` and `attempt`. A recovery shows as records of a new
(attempt, gen) pair; the step it starts from tells how many steps were lost.
Measures (`../shared/research/goodput.md`, "Measures used in the field"):
- recovery: from the fault to the first step completed by the new processes;
- steps lost: the last step completed before the fault minus the step resumed from;
- goodput: productive step time over wall time, where productive time is the number of
  distinct steps the run needed times the median healthy step time.
"""

from __future__ import annotations

import itertools
import json
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class StepRecord:
    step: int
    t: float
    gen: int
    attempt: int

    @property
    def incarnation(self) -> tuple[int, int]:
        """Which processes completed it: (pod attempt, elastic generation)."""
        return (self.attempt, self.gen)


@dataclass(frozen=True)
class Recovery:
    fault_at: float
    last_step_before: int | None
    first_new_at: float | None
    resumed_from: int | None

    @property
    def seconds(self) -> float | None:
        return None if self.first_new_at is None else self.first_new_at - self.fault_at

    @property
    def steps_lost(self) -> int | None:
        if self.last_step_before is None or self.resumed_from is None:
            return None
        return max(0, self.last_step_before - self.resumed_from)


def read_steps(path: Path) -> list[StepRecord]:
    """One rank's records in the order written; a torn last line (a killed writer) is skipped."""
    records = []
    for line in path.read_text().splitlines() if path.exists() else ():
        try:
            raw = json.loads(line)
            records.append(StepRecord(int(raw["step"]), float(raw["t"]), int(raw["gen"]),
                                      int(raw["attempt"])))  # fmt: skip
        except (ValueError, KeyError, TypeError):
            continue
    return records


def recovery(records: Sequence[StepRecord], fault_at: float) -> Recovery:
    """How the run came back from a fault at `fault_at`, from one rank's records."""
    before = [r for r in records if r.t <= fault_at]
    last = before[-1] if before else None
    after = (r for r in records if r.t > fault_at)
    first_new = next((r for r in after if last is None or r.incarnation != last.incarnation), None)
    return Recovery(
        fault_at=fault_at,
        last_step_before=None if last is None else last.step,
        first_new_at=None if first_new is None else first_new.t,
        resumed_from=None if first_new is None else first_new.step - 1,
    )


def healthy_step_seconds(records: Sequence[StepRecord], faults: Iterable[float]) -> float | None:
    """Median time between consecutive steps of the same processes, away from any fault."""
    fault_times = sorted(faults)
    gaps = []
    for previous, current in itertools.pairwise(records):
        if current.incarnation != previous.incarnation or current.step != previous.step + 1:
            continue
        if any(previous.t <= f <= current.t for f in fault_times):
            continue
        gaps.append(current.t - previous.t)
    return statistics.median(gaps) if gaps else None


def goodput(records: Sequence[StepRecord], started_at: float, step_seconds: float) -> float:
    """Distinct steps x healthy step time over the wall time from `started_at` to the last step."""
    if not records:
        return 0.0
    wall = max(r.t for r in records) - started_at
    distinct = len({r.step for r in records})
    return min(1.0, distinct * step_seconds / wall) if wall > 0 else 0.0
