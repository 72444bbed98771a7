"""When a gang held back for its preferred level may spread (rule 8 of queueing.py).

Pure. Mirrors Slurm's `--switches=count@max-time` as slurmctld counts it: the
clock starts the first time the job could have started with more switches than
it asked for (`wait4switch_start`), not when it was submitted, so time spent
waiting for any room at all, or behind earlier jobs, does not use up the wait.
Here that is the first round whose decision for the attempt was
WaitingForPreferredLevel. Once started, the clock runs until the attempt is
placed or withdrawn, even through rounds that held the gang for another reason.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field


@dataclass
class SpreadClock:
    # key -> (attempt, seconds) of the first round that held the attempt for its level
    _held: dict[Hashable, tuple[int, float]] = field(default_factory=dict)

    def held(self, key: Hashable, attempt: int, now: float) -> None:
        """A round held this attempt back for its preferred level at `now`."""
        known = self._held.get(key)
        if known is None or known[0] != attempt:
            self._held[key] = (attempt, now)

    def may_spread(self, key: Hashable, attempt: int, wait: float, now: float) -> bool:
        """Whether the attempt has been held `wait` seconds; a wait of 0 never holds it."""
        if wait <= 0:
            return True
        known = self._held.get(key)
        if known is None or known[0] != attempt:
            return False
        return now - known[1] >= wait

    def ends_at(self, key: Hashable, attempt: int, wait: float) -> float | None:
        """When the attempt's wait ends (the clock's units); None when it is not held."""
        known = self._held.get(key)
        if wait <= 0 or known is None or known[0] != attempt:
            return None
        return known[1] + wait

    def keep_only(self, attempts: Mapping[Hashable, int]) -> None:
        """Forget every gang not still waiting with the same attempt."""
        self._held = {k: v for k, v in self._held.items() if attempts.get(k) == v[0]}
