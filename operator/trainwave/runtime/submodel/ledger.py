"""Which tier each tensor is in, and how many bytes each tier holds.

Pure (stdlib only). The executor records every move here; the ledger refuses a
charge that would take the device tier over its budget, so "never over budget"
is checked where it is decided, not inferred afterwards. It is one of the three
peak measures (see census.py and the tests for the other two).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field

DEVICE = "device"
HOST = "host"
TIERS = (DEVICE, HOST)


class BudgetExceeded(RuntimeError):
    """The device tier would hold more than its budget."""


@dataclass
class Ledger:
    budget: int
    entries: dict[Hashable, tuple[str, int]] = field(default_factory=dict)
    used: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TIERS, 0))
    peak: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TIERS, 0))

    def place(self, key: Hashable, tier: str, nbytes: int) -> None:
        """Record `key` (nbytes) in `tier`, moving it out of its current tier."""
        if tier not in TIERS:
            raise ValueError(f"tier: got {tier!r}; expected one of {TIERS}")
        if nbytes < 0:
            raise ValueError(f"nbytes: got {nbytes} for {key!r}; expected >= 0")
        old = self.entries.get(key)
        freed = old[1] if old is not None and old[0] == tier else 0
        if tier == DEVICE and self.used[DEVICE] - freed + nbytes > self.budget:
            raise BudgetExceeded(
                f"device budget {self.budget} B: {key!r} needs {nbytes} B with "
                f"{self.used[DEVICE] - freed} B already resident"
            )
        self.drop(key)
        self.entries[key] = (tier, nbytes)
        self.used[tier] += nbytes
        self.peak[tier] = max(self.peak[tier], self.used[tier])

    def drop(self, key: Hashable) -> None:
        """Forget `key` (its memory is freed)."""
        old = self.entries.pop(key, None)
        if old is not None:
            self.used[old[0]] -= old[1]

    def tier_of(self, key: Hashable) -> str | None:
        entry = self.entries.get(key)
        return None if entry is None else entry[0]

    def keys_in(self, tier: str) -> list[Hashable]:
        return [key for key, (where, _) in self.entries.items() if where == tier]

    def reset_peak(self) -> None:
        self.peak = dict(self.used)

    def check(self) -> None:
        """Totals equal the sum of the entries, and the device is within budget."""
        for tier in TIERS:
            total = sum(n for where, n in self.entries.values() if where == tier)
            if total != self.used[tier]:
                raise AssertionError(
                    f"{tier}: entries sum to {total}, total says {self.used[tier]}"
                )
        if self.used[DEVICE] > self.budget:
            raise AssertionError(f"device holds {self.used[DEVICE]} B over budget {self.budget}")
