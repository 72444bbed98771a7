"""Exponential backoff with jitter: the one formula for every retry in trainwave. Stdlib only.

Mirrors client-go's `wait.Backoff` (k8s.io/apimachinery v0.34.4,
pkg/util/wait/backoff.go, `delay()`; `Jitter()` in wait.go): the n-th delay is
`base * factor**(n-1)`, held at `cap` once it would pass it, and then
lengthened by a random amount drawn uniformly from [0, jitter * delay), so that
many clients failing together do not retry together. With jitter 0 the delay is
exact, the shape of workqueue's ItemExponentialFailureRateLimiter
(k8s.io/client-go v0.34.4, util/workqueue/default_rate_limiters.go), which is
what a pure decision needs: its delay is written into a status.

Users: the informers' relist after failed watches, the work queue's retry of a
failed reconcile, the reconciler's retry of a child the API server refused, and
the pure failure policy's delay before an Ignore restart (jitter 0).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Backoff:
    """Seconds: `base` for the first failure, times `factor` for each one after, at most
    `cap` before jitter; `jitter` is the largest fraction of the delay added at random."""

    base: float
    cap: float
    factor: float = 2.0
    jitter: float = 0.0

    def __post_init__(self) -> None:
        if self.base < 0 or self.cap < 0 or self.factor < 1 or self.jitter < 0:
            raise ValueError(
                f"backoff base={self.base} cap={self.cap} factor={self.factor} "
                f"jitter={self.jitter}: base, cap and jitter must be >= 0 and factor >= 1"
            )

    def delay(self, failures: int, rand: Callable[[], float] = random.random) -> float:
        """Seconds to wait after `failures` failures in a row (1 for the first).

        `rand` returns a float in [0, 1); a seeded `random.Random(...).random` makes
        the jitter repeatable in tests.
        """
        if failures < 1:
            raise ValueError(f"failures={failures}: the count of failures in a row starts at 1")
        seconds = min(self.base, self.cap)
        # Multiplied step by step, as wait.Backoff does, so a long run of failures never
        # overflows a float: it reaches the cap in a few dozen steps and stays there.
        steps = failures - 1
        while steps and 0 < seconds < self.cap and self.factor > 1:
            seconds = min(seconds * self.factor, self.cap)
            steps -= 1
        if self.jitter > 0:
            seconds += rand() * self.jitter * seconds
        return seconds
