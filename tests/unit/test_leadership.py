"""Leader election rules (kube/leadership.py) against an in-memory Lease with
resourceVersion compare-and-swap and a fake clock. The same code against the real API
server: tests/integration/test_leader_failover.py."""

from __future__ import annotations

import dataclasses

import pytest

from trainwave.kube.leadership import (
    Conflict,
    LeaderElector,
    LeaseRecord,
    NotLeading,
    Timing,
)

pytestmark = pytest.mark.timeout(10)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class MemoryLease:
    """One Lease; a write with a stale resourceVersion is refused like the API server's 409."""

    def __init__(self) -> None:
        self.record: LeaseRecord | None = None
        self.version = 0
        self.down = False

    def get(self, timeout: float) -> LeaseRecord | None:
        if self.down:
            raise OSError("connection refused")
        return self.record

    def create(self, record: LeaseRecord, timeout: float) -> LeaseRecord:
        if self.record is not None:
            raise Conflict("exists")
        return self._store(record)

    def update(self, record: LeaseRecord, timeout: float) -> LeaseRecord:
        if self.down:
            raise OSError("connection refused")
        if self.record is None or record.resource_version != self.record.resource_version:
            raise Conflict("changed")
        return self._store(record)

    def _store(self, record: LeaseRecord) -> LeaseRecord:
        self.version += 1
        self.record = dataclasses.replace(record, resource_version=str(self.version))
        return self.record


def make_elector(
    lease: MemoryLease, clock: Clock, name: str, *, pod: str = "", lost: list[str] | None = None
) -> LeaderElector:
    return LeaderElector(
        lease,
        name,
        Timing(),
        pod_name=pod,
        clock=clock,
        wall=lambda: f"t{clock.now}",
        on_lost=lambda: (lost if lost is not None else []).append(name),
    )


@pytest.fixture
def lease() -> MemoryLease:
    return MemoryLease()


@pytest.fixture
def clock() -> Clock:
    return Clock()


def test_first_candidate_creates_the_lease_and_leads(lease, clock):
    a = make_elector(lease, clock, "a_1")
    assert a.try_acquire_or_renew()
    assert a.leading()
    assert lease.record is not None
    assert (lease.record.holder, lease.record.duration_seconds) == ("a_1", 15)
    assert lease.record.transitions == 0


def test_standby_waits_out_the_lease_duration_by_its_own_clock(lease, clock):
    a, b = make_elector(lease, clock, "a_1"), make_elector(lease, clock, "b_1")
    assert a.try_acquire_or_renew()
    assert not b.try_acquire_or_renew()  # b first sees the record now
    clock.now += 14.9
    assert not b.try_acquire_or_renew()
    clock.now += 0.1
    assert b.try_acquire_or_renew()
    assert lease.record is not None
    assert (lease.record.holder, lease.record.transitions) == ("b_1", 1)


def test_a_renewal_restarts_the_standbys_wait(lease, clock):
    a, b = make_elector(lease, clock, "a_1"), make_elector(lease, clock, "b_1")
    a.try_acquire_or_renew()
    b.try_acquire_or_renew()
    clock.now += 10
    assert a.try_acquire_or_renew()  # renewTime changes: b observes a new record
    clock.now += 10
    assert not b.try_acquire_or_renew()  # the first time b sees the renewed record
    clock.now += 14.9
    assert not b.try_acquire_or_renew()  # 24.9 s after a's renewal, 14.9 s of b's clock
    clock.now += 0.1
    assert b.try_acquire_or_renew()


def test_renewal_keeps_acquire_time_and_transitions(lease, clock):
    a = make_elector(lease, clock, "a_1")
    a.try_acquire_or_renew()
    clock.now += 2
    a.try_acquire_or_renew()
    assert lease.record is not None
    assert (lease.record.acquire_time, lease.record.renew_time) == ("t1000.0", "t1002.0")
    assert lease.record.transitions == 0


def test_two_candidates_on_one_expired_record_one_wins(lease, clock):
    a, b, c = (make_elector(lease, clock, n) for n in ("a_1", "b_1", "c_1"))
    a.try_acquire_or_renew()
    b.try_acquire_or_renew()
    c.try_acquire_or_renew()
    clock.now += 16
    # Both read the same resourceVersion; the second write is refused.
    record = lease.get(1)
    real_get = lease.get
    lease.get = lambda timeout: record  # type: ignore[method-assign]
    try:
        assert b.try_acquire_or_renew()
        assert not c.try_acquire_or_renew()
    finally:
        lease.get = real_get  # type: ignore[method-assign]
    assert lease.record is not None
    assert lease.record.holder == "b_1"


def test_released_lease_is_taken_at_once(lease, clock):
    a, b = make_elector(lease, clock, "a_1"), make_elector(lease, clock, "b_1")
    a.try_acquire_or_renew()
    b.try_acquire_or_renew()
    a.release()
    assert lease.record is not None
    assert (lease.record.holder, lease.record.duration_seconds) == ("", 1)
    assert b.try_acquire_or_renew()
    with pytest.raises(NotLeading):
        a.check()


def test_earlier_run_of_the_same_pod_is_taken_over_at_once(lease, clock):
    first = make_elector(lease, clock, "op-7d9-x_aaa", pod="op-7d9-x")
    first.try_acquire_or_renew()
    restarted = make_elector(lease, clock, "op-7d9-x_bbb", pod="op-7d9-x")
    assert restarted.try_acquire_or_renew()
    other_pod = make_elector(lease, clock, "op-7d9-y_ccc", pod="op-7d9-y")
    assert not other_pod.try_acquire_or_renew()


def test_without_a_pod_name_a_restart_waits_like_anyone(lease, clock):
    make_elector(lease, clock, "host_aaa").try_acquire_or_renew()
    assert not make_elector(lease, clock, "host_bbb").try_acquire_or_renew()


def test_writes_are_refused_on_a_standby(lease, clock):
    a, b = make_elector(lease, clock, "a_1"), make_elector(lease, clock, "b_1")
    a.try_acquire_or_renew()
    b.try_acquire_or_renew()
    a.check()
    with pytest.raises(NotLeading):
        b.check()


def test_leader_stops_when_renew_deadline_passes(lease, clock):
    lost: list[str] = []
    a = make_elector(lease, clock, "a_1", lost=lost)
    a.try_acquire_or_renew()
    lease.down = True
    clock.now += 9.9
    a.check()  # still inside the deadline: writes go on
    clock.now += 0.1
    with pytest.raises(NotLeading):
        a.check()
    assert lost == ["a_1"]


def test_leader_stops_at_once_when_someone_else_holds_the_lease(lease, clock):
    lost: list[str] = []
    a = make_elector(lease, clock, "a_1", lost=lost)
    a.try_acquire_or_renew()
    assert lease.record is not None
    lease.record = dataclasses.replace(lease.record, holder="b_1")
    assert not a.try_acquire_or_renew()
    assert lost == ["a_1"]
    assert not a.leading()


def test_when_leading_runs_callbacks_once_leading(lease, clock):
    a = make_elector(lease, clock, "a_1")
    called: list[str] = []
    a.when_leading(lambda: called.append("early"))
    assert called == []
    a.try_acquire_or_renew()
    a.when_leading(lambda: called.append("late"))
    assert called == ["late"]  # "early" runs from run(), after the first acquire


@pytest.mark.parametrize(
    ("lease_duration", "renew_deadline", "retry_period", "message"),
    [
        pytest.param(10, 10, 2, "greater than the renew deadline", id="deadline-not-below"),
        pytest.param(15, 2.4, 2, "1.2 x retry period", id="deadline-not-above-1.2x-retry"),
        pytest.param(15, 10, 0, "period above 0", id="zero-retry"),
    ],
)
def test_timing_refuses_what_client_go_refuses(
    lease_duration, renew_deadline, retry_period, message
):
    with pytest.raises(ValueError, match=message):
        Timing(lease_duration, renew_deadline, retry_period)


def test_takeover_bound_of_the_defaults():
    assert Timing().takeover_bound == pytest.approx(19.8)
