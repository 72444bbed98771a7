"""`auto` by measurement: which strategy each early training step runs, and the pick.

Pure: no torch, no I/O, no clock. The cost model (strategy.py) is a good guide
to what *could* win and a poor judge of what *does*: on a busy CPU it
underestimated PowerSGD's cost by 3-7x. So the model only prunes, and the
first steps of training time the survivors:

    step:      0    1    2    3    4    5   ...  (interim)  powersgd x4  then the pick
    strategy:  flat fp16 hier flat fp16 hier ...

Candidates take turns, one step each, for `warmup_steps` untimed rounds
(buffers and threads are set up there) and `timed_steps` timed ones: on a
shared machine a burst of load then slows every candidate, not just the one
that happened to run. Every rank runs the same strategy at the same step
because the schedule depends only on the candidate list and the step count,
never on local timings. Timings enter at agreement points only, where the
driver averages every rank's medians with one allreduce and hands the same
numbers to `agree()` on every rank.

PowerSGD compresses only from its `start_iter` on (before that it *is* a flat
allreduce), so its trial cannot begin earlier, and it keeps state from step to
step (error feedback, warm start), so its steps run back to back, after the
others' rounds; until its start, the fastest candidate measured so far runs
(an interim agreement picks it). Ties go to the earlier candidate in the list.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from trainwave.runtime.comm.strategy import EXACT


@dataclass(frozen=True)
class TrialOptions:
    """How `auto` measures: steps per candidate, how many candidates, how it decides."""

    warmup_steps: int = 1
    timed_steps: int = 3
    # The baseline (flat) and the best exact strategy always make the list;
    # the rest are the model's favourites, up to this many in all (5: every
    # strategy the model does not call hopeless; it has ranked near-ties wrongly).
    max_candidates: int = 5
    # Candidates the model thinks this many times slower than its favourite are
    # not worth their trial steps (the model has been off by up to ~7x, not 10x).
    prune_factor: float = 10.0
    # A lossy strategy changes the numbers the optimizer sees; it is chosen only
    # when measured this many times faster than the best exact one.
    lossy_margin: float = 1.1

    def __post_init__(self) -> None:
        if self.warmup_steps < 1:
            raise ValueError(
                f"TrialOptions.warmup_steps={self.warmup_steps}: must be >= 1, the first step "
                "of a strategy pays its one-time setup"
            )
        for name in ("timed_steps", "max_candidates"):
            if getattr(self, name) < 1:
                raise ValueError(f"TrialOptions.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("prune_factor", "lossy_margin"):
            if not getattr(self, name) >= 1.0:
                raise ValueError(f"TrialOptions.{name} must be >= 1.0, got {getattr(self, name)}")


def prune(estimates: Mapping[str, float], options: TrialOptions) -> tuple[list[str], list[str]]:
    """(candidates to measure in trial order, strategies left out) from the model's estimates."""
    if not estimates:
        return [], []
    ranked = sorted(estimates, key=lambda s: (estimates[s], s))
    best = estimates[ranked[0]]
    keep: list[str] = []
    # flat is what DDP does without us: a trial never loses to it by more than noise.
    if "flat" in estimates:
        keep.append("flat")
    exact = [s for s in ranked if s in EXACT]
    if exact and exact[0] not in keep:
        keep.append(exact[0])
    for s in ranked:
        if len(keep) >= options.max_candidates:
            break
        if s not in keep and estimates[s] <= best * options.prune_factor:
            keep.append(s)
    return trial_order(keep), [s for s in ranked if s not in keep]


def trial_order(candidates: Collection[str]) -> list[str]:
    """Exact strategies first (flat, then hierarchical), then the lossy ones, PowerSGD last."""
    rank = {"flat": 0, "hierarchical": 1, "fp16": 2, "hierarchical+fp16": 3, "powersgd": 4}
    return sorted(candidates, key=lambda s: (rank.get(s, 5), s))


def pick_fastest(times: Mapping[str, float], lossy_margin: float) -> tuple[str, str]:
    """(strategy, why): the fastest exact one, unless a lossy one beats it by `lossy_margin`."""
    if not times:
        raise ValueError("pick_fastest needs at least one timed strategy")
    order = list(times)

    def fastest(names: Sequence[str]) -> str:
        return min(names, key=lambda s: (times[s], order.index(s)))

    exact = [s for s in order if s in EXACT]
    lossy = [s for s in order if s not in EXACT]
    if not exact:
        best = fastest(lossy)
        return best, f"{best} is the fastest of the allowed strategies"
    best_exact = fastest(exact)
    if not lossy:
        return best_exact, f"{best_exact} is the fastest exact strategy"
    best_lossy = fastest(lossy)
    gain = times[best_exact] / times[best_lossy] if times[best_lossy] > 0 else math.inf
    if gain > lossy_margin:
        return best_lossy, f"{best_lossy} is {gain:.2f}x faster than {best_exact}"
    return best_exact, (
        f"{best_exact} is the fastest exact strategy; {best_lossy} would gain "
        f"{gain:.2f}x <= {lossy_margin}x"
    )


@dataclass
class Trials:
    """The schedule of trial steps, the local timings, and the agreed decision."""

    candidates: Sequence[str]
    options: TrialOptions = field(default_factory=TrialOptions)
    # The first step a candidate's trial may begin (PowerSGD: its start_iter).
    not_before: Mapping[str, int] = field(default_factory=dict)
    step: int = 0  # synchronized steps finished so far
    samples: dict[str, list[float]] = field(default_factory=dict)
    agreed: dict[str, float] = field(default_factory=dict)  # mean over ranks of each median
    interim: str | None = None
    chosen: str | None = None
    reason: str = ""

    def __post_init__(self) -> None:
        if len(set(self.candidates)) != len(self.candidates) or not self.candidates:
            raise ValueError(
                f"Trials.candidates must be distinct and non-empty, got {list(self.candidates)}"
            )
        opts = self.options
        rounds = opts.warmup_steps + opts.timed_steps
        now_ones = [c for c in self.candidates if self.not_before.get(c, 0) <= 0]
        later = sorted(
            (c for c in self.candidates if self.not_before.get(c, 0) > 0),
            key=lambda c: (self.not_before[c], list(self.candidates).index(c)),
        )
        # Per step: the strategy (None: the interim pick) and whether it is timed.
        plan: list[str | None] = []
        timed: list[bool] = []
        for r in range(rounds):  # round-robin, so a burst of load hits every candidate
            plan += now_ones
            timed += [r >= opts.warmup_steps] * len(now_ones)
        for c in later:  # stateful (PowerSGD): one block, its own steps back to back
            wait = max(0, self.not_before[c] - len(plan))
            plan += [None] * wait
            timed += [False] * wait
            plan += [c] * rounds
            timed += [i >= opts.warmup_steps for i in range(rounds)]
        if len(self.candidates) == 1:
            plan, timed = [], []
            self.chosen, self.reason = self.candidates[0], "the only candidate"
        self._plan, self._timed = plan, timed
        if plan and plan[0] is None:
            # Every trial waits for a later start: run the first candidate until then.
            self.interim = self.candidates[0]
        self.end = len(plan)  # the step from which the final pick runs

    # -- what runs when ---------------------------------------------------------
    def strategy_at(self, step: int) -> str:
        """The strategy that reduces the gradients of synchronized step `step` (0-based)."""
        if step < self.end:
            planned = self._plan[step]
            if planned is not None:
                return planned
            if self.interim is None:
                raise RuntimeError(f"step {step} needs the interim pick; call agree() first")
            return self.interim
        if self.chosen is None:
            raise RuntimeError(f"step {step} is past the trials; call agree() first")
        return self.chosen

    @property
    def current(self) -> str:
        return self.strategy_at(self.step)

    def finished(self, seconds: float) -> None:
        """The step in progress took `seconds` (from the previous step's end); count it."""
        if self.step < self.end and self._timed[self.step]:
            name = self._plan[self.step]
            assert name is not None  # interim steps are never timed
            self.samples.setdefault(name, []).append(seconds)
        self.step += 1

    # -- agreement ----------------------------------------------------------------
    @property
    def due(self) -> bool:
        """Whether the ranks must agree before the next step: an interim or the final pick."""
        if self.step == self.end:
            return self.chosen is None
        return self.interim is None and self._filler_starts(self.step)

    def pending(self) -> list[str]:
        """The strategies measured but not yet agreed on: what the next agreement covers."""
        return [c for c in self.candidates if c in self.samples and c not in self.agreed]

    def local_medians(self, names: Sequence[str]) -> list[float]:
        return [statistics.median(self.samples[n]) for n in names]

    def agree(self, names: Sequence[str], seconds: Sequence[float]) -> None:
        """The ranks' mean medians for `names`; decides the interim or the final pick."""
        self.agreed.update(zip(names, seconds, strict=True))
        timed = {c: self.agreed[c] for c in self.candidates if c in self.agreed}
        if not timed:  # a deferred trial comes first: run the first candidate until then
            self.interim = self.candidates[0]
            return
        pick, why = pick_fastest(timed, self.options.lossy_margin)
        if self.step >= self.end:
            self.chosen, self.reason = pick, why
        else:
            self.interim = pick

    @property
    def measuring(self) -> bool:
        return self.step < self.end

    def _filler_starts(self, step: int) -> bool:
        return (
            step < self.end
            and self._plan[step] is None
            and (step == 0 or self._plan[step - 1] is not None)
        )
