"""Expectations (kube/expectations.py): a controller waits for what it created to show
in its cache, and never longer than the ttl."""

from __future__ import annotations

import pytest

from trainwave.kube.expectations import Expectations

pytestmark = pytest.mark.timeout(10)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_nothing_expected_waits_for_nothing() -> None:
    expectations: Expectations[str] = Expectations(ttl=15, clock=Clock())
    assert expectations.wait("ns/a", []) is None
    assert expectations.satisfied("ns/a", [])


def test_waits_until_every_created_name_is_seen_then_forgets() -> None:
    clock = Clock()
    expectations: Expectations[str] = Expectations(ttl=15, clock=clock)
    expectations.expect("ns/a", ["a-0", "a-1"], tag=3)
    expected = expectations.get("ns/a")
    assert expected is not None
    assert (expected.tag, expected.names) == (3, frozenset({"a-0", "a-1"}))
    clock.now += 5
    assert expectations.wait("ns/a", ["a-0"]) == pytest.approx(10.0)
    assert expectations.wait("ns/a", ["a-0", "a-1", "b-0"]) is None
    assert len(expectations) == 0, "a met expectation is forgotten"
    assert expectations.wait("ns/a", []) is None


def test_an_expectation_lapses_after_its_ttl() -> None:
    clock = Clock()
    expectations: Expectations[str] = Expectations(ttl=15, clock=clock)
    expectations.expect("ns/a", ["a-0"])
    clock.now += 14.9
    assert not expectations.satisfied("ns/a", [])
    clock.now += 0.1
    assert expectations.satisfied("ns/a", []), "an event never seen must not hold it forever"
    assert len(expectations) == 0


def test_keys_are_apart_and_a_new_expectation_replaces_the_old() -> None:
    clock = Clock()
    expectations: Expectations[str] = Expectations(ttl=15, clock=clock)
    expectations.expect("ns/a", ["a-0"])
    expectations.expect("ns/b", ["b-0"])
    expectations.expect("ns/a", ["a-9"], tag=2)
    assert expectations.wait("ns/a", ["a-0"]) is not None
    assert expectations.satisfied("ns/a", ["a-9"])
    expectations.delete("ns/b")
    assert expectations.satisfied("ns/b", [])


@pytest.mark.parametrize("ttl", [0, -1.0])
def test_a_ttl_that_is_not_positive_is_refused_naming_it(ttl: float) -> None:
    with pytest.raises(ValueError, match=f"ttl={ttl}: must be > 0"):
        Expectations(ttl=ttl)
