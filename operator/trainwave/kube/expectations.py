"""What a controller created and waits to see in its watch cache.

Mirrors ControllerExpectations (k8s.io/kubernetes pkg/controller/controller_utils.go):
after creating objects, a controller must not decide again from a cache that does
not show them yet, or it creates them twice and counts them missing. The Go type
counts adds and lowers the count on each watch event; here the cache is read
whole on every reconcile (level-triggered), so an expectation names what was
created and is met when the cache shows all of it. Like ExpectationsTimeout, an
expectation lapses: an event lost (a create that never came back, a watch that
missed it) must not hold the controller forever. Its `tag` (an attempt, a
generation) says which round the names belong to: the caller compares it with
what it sees.

Not thread-safe: read and written by one event loop's reconciles.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True)
class Expectation:
    """Names created under `tag`, awaited until `until` (the expectations' clock)."""

    tag: Hashable
    names: frozenset[str]
    until: float


class Expectations(Generic[K]):
    def __init__(self, ttl: float, clock: Callable[[], float] = time.monotonic):
        if ttl <= 0:
            raise ValueError(f"expectations ttl={ttl}: must be > 0 seconds")
        self._ttl = ttl
        self._clock = clock
        self._pending: dict[K, Expectation] = {}

    def __len__(self) -> int:
        return len(self._pending)

    def expect(self, key: K, names: Iterable[str], tag: Hashable = None) -> None:
        """`names` were just created for `key` (client-go's ExpectCreations); replaces
        what was expected before."""
        self._pending[key] = Expectation(tag, frozenset(names), self._clock() + self._ttl)

    def get(self, key: K) -> Expectation | None:
        return self._pending.get(key)

    def wait(self, key: K, seen: Iterable[str]) -> float | None:
        """Seconds still to wait for `key` while some expected name is not in `seen`;
        None when nothing is awaited (SatisfiedExpectations): all seen, or lapsed.
        Either way a met or lapsed expectation is forgotten."""
        expected = self._pending.get(key)
        if expected is None:
            return None
        left = expected.until - self._clock()
        if left <= 0 or expected.names <= set(seen):
            del self._pending[key]
            return None
        return left

    def satisfied(self, key: K, seen: Iterable[str]) -> bool:
        return self.wait(key, seen) is None

    def delete(self, key: K) -> None:
        """`key` is gone, or starts over (DeleteExpectations)."""
        self._pending.pop(key, None)
