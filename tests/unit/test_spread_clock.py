"""placement/spread_clock.py: the preferred-level wait counts from the first round that held
the gang for its level (Slurm's wait4switch_start), per attempt."""

from __future__ import annotations

import pytest

from trainwave.placement.spread_clock import SpreadClock

pytestmark = pytest.mark.timeout(10)


def test_the_wait_starts_when_the_level_first_held_the_gang_not_when_it_arrived() -> None:
    clock = SpreadClock()
    # Rounds before t=100 held it for other reasons (no room at all): no clock yet.
    assert not clock.may_spread("a", 0, 10, now=100)
    clock.held("a", 0, now=100)
    assert not clock.may_spread("a", 0, 10, now=109.9)
    clock.held("a", 0, now=105)  # later holds do not restart it
    assert clock.may_spread("a", 0, 10, now=110)


def test_a_new_attempt_waits_afresh_and_no_wait_never_holds() -> None:
    clock = SpreadClock()
    clock.held("a", 0, now=0)
    assert clock.may_spread("a", 0, 10, now=50)
    assert not clock.may_spread("a", 1, 10, now=50)
    clock.held("a", 1, now=50)
    assert not clock.may_spread("a", 1, 10, now=55)
    assert clock.may_spread("b", 0, 0, now=0)


def test_gangs_no_longer_waiting_are_forgotten() -> None:
    clock = SpreadClock()
    clock.held("a", 0, now=0)
    clock.held("b", 0, now=0)
    clock.held("c", 2, now=0)
    clock.keep_only({"b": 0, "c": 3})  # a placed; c moved on to attempt 3
    assert not clock.may_spread("a", 0, 1, now=10)
    assert clock.may_spread("b", 0, 1, now=10)
    assert not clock.may_spread("c", 2, 1, now=10)


def test_the_placer_knows_when_a_wait_ends_so_it_can_run_a_round_then() -> None:
    clock = SpreadClock()
    assert clock.ends_at("a", 0, 10) is None  # not held yet
    clock.held("a", 0, now=100)
    clock.held("a", 0, now=104)
    assert clock.ends_at("a", 0, 10) == 110
    assert clock.ends_at("a", 1, 10) is None  # another attempt
    assert clock.ends_at("a", 0, 0) is None  # no wait: spreads at once
