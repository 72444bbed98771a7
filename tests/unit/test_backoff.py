"""The one backoff formula: client-go's wait.Backoff steps, capped, with seeded jitter."""

from __future__ import annotations

import random

import pytest

from trainwave.backoff import Backoff
from trainwave.controller.reconciler import REFUSED_BACKOFF
from trainwave.kube.informer import RELIST_BACKOFF
from trainwave.kube.queue import RETRY
from trainwave.lifecycle.restarts import ignore_backoff

pytestmark = pytest.mark.timeout(10)

STEPS = {
    # base, cap, factor -> the delays after 1, 2, 3 ... failures in a row
    "doubling to the cap": (Backoff(1.0, cap=30.0), [1, 2, 4, 8, 16, 30, 30]),
    "factor 3": (Backoff(0.5, cap=10.0, factor=3.0), [0.5, 1.5, 4.5, 10, 10, 10, 10]),
    "factor 1 is constant": (Backoff(2.0, cap=30.0, factor=1.0), [2] * 7),
    "base above the cap": (Backoff(60.0, cap=30.0), [30] * 7),
    "zero base stays zero": (Backoff(0.0, cap=30.0), [0] * 7),
}  # fmt: skip


@pytest.mark.parametrize(("backoff", "delays"), STEPS.values(), ids=STEPS.keys())
def test_without_jitter_the_delays_are_exact(backoff: Backoff, delays: list[float]) -> None:
    assert [backoff.delay(n) for n in range(1, len(delays) + 1)] == delays


def test_a_long_run_of_failures_stays_at_the_cap_without_overflow() -> None:
    assert Backoff(1.0, cap=30.0).delay(1_000_000) == 30.0
    assert Backoff(1e-300, cap=1e300, factor=10.0).delay(10_000) == 1e300


@pytest.mark.parametrize("failures", [1, 2, 5, 40])
def test_jitter_adds_up_to_its_fraction_of_the_delay(failures: int) -> None:
    backoff = Backoff(1.0, cap=30.0, jitter=0.5)
    exact = Backoff(1.0, cap=30.0).delay(failures)
    draws = random.Random(failures)
    delays = [backoff.delay(failures, draws.random) for _ in range(500)]
    assert all(exact <= d < exact * 1.5 for d in delays)
    # Spread over the range, not stuck at one end: the point of jitter.
    assert min(delays) < exact * 1.1
    assert max(delays) > exact * 1.4


def test_the_same_seed_gives_the_same_delays_and_the_extremes_are_the_bounds() -> None:
    backoff = Backoff(2.0, cap=300.0, jitter=0.1)
    first = [backoff.delay(n, random.Random(7).random) for n in range(1, 10)]
    again = [backoff.delay(n, random.Random(7).random) for n in range(1, 10)]
    assert first == again
    assert backoff.delay(3, lambda: 0.0) == 8.0
    assert backoff.delay(9, lambda: 0.999) == pytest.approx(300.0 * 1.0999)


@pytest.mark.parametrize(
    "kwargs",
    [{"base": -1.0}, {"cap": -1.0}, {"factor": 0.5}, {"jitter": -0.1}],
    ids=["base", "cap", "factor", "jitter"],
)
def test_nonsense_parameters_are_refused_naming_them(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="must be >= 0 and factor >= 1"):
        Backoff(**{"base": 1.0, "cap": 10.0, **kwargs})


def test_failures_count_from_one() -> None:
    with pytest.raises(ValueError, match="failures=0"):
        Backoff(1.0, cap=10.0).delay(0)


USERS = {
    # every retry in the operator goes through the formula, with the bounds it had
    "informer relist": (RELIST_BACKOFF, [1, 2, 4, 8, 16, 30, 30], 0.1),
    "queue retry": (RETRY, [1, 2, 4, 8, 16, 32, 60, 60], 0.1),
    "refused child": (REFUSED_BACKOFF, [2, 4, 8, 16, 32, 64, 128, 256, 300, 300], 0.1),
}  # fmt: skip


@pytest.mark.parametrize(("backoff", "delays", "jitter"), USERS.values(), ids=USERS.keys())
def test_the_operators_retries(backoff: Backoff, delays: list[float], jitter: float) -> None:
    assert [backoff.delay(n, lambda: 0.0) for n in range(1, len(delays) + 1)] == delays
    assert backoff.jitter == jitter


def test_the_ignore_restart_delay_is_the_formula_without_jitter() -> None:
    assert [ignore_backoff(10, n) for n in range(1, 8)] == [10, 20, 40, 80, 160, 300, 300]
    assert ignore_backoff(10, 10_000) == 300
