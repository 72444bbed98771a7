"""Leader election on a coordination.k8s.io Lease, the way client-go does it.

Mirrors k8s.io/client-go/tools/leaderelection (leaderelection.go and
resourcelock/leaselock.go) with controller-runtime's defaults
(pkg/manager/internal.go: leaseDuration 15 s, renewDeadline 10 s, retryPeriod 2 s):

- Acquire. Read the Lease; take it when nobody holds it, or when its record has not
  changed for leaseDurationSeconds as measured by *this process's* monotonic clock from
  the moment it first saw that record (client-go's observedTime). Clock offsets between
  replicas do not matter, only their rates. The write carries the resourceVersion that
  was read, so of two candidates one gets 409 and reads again: never two holders.
- Renew. The leader rewrites renewTime every retryPeriod. When no renewal has succeeded
  for renewDeadline, or the Lease names another holder, leadership is lost and the
  process exits at once (controller-runtime returns "leader election lost" and the
  binary exits). A Lease gives no fencing; stopping is the fence. Others may acquire
  only leaseDuration after they saw the last renewal, and renewDeadline < leaseDuration,
  so the old leader is gone leaseDuration - renewDeadline seconds before a new one acts.
- Writers ask `check()` before every API write: it also fails once renewDeadline has
  passed, which covers a process that was frozen (SIGSTOP, a stalled VM) and wakes up
  with writes already queued, before its renew thread has run.
- Release. On a graceful stop, once the guarded work has finished, the holder is cleared
  (client-go's ReleaseOnCancel) so a standby takes over within retryPeriod, not
  leaseDuration: rolling updates hand over in about two seconds.

Takeover after a crash is bounded by leaseDuration + 2 x 1.2 x retryPeriod (plus API round
trips): a standby polls every retryPeriod (jittered up to 1.2x), so it may see the leader's
last renewal one period late, and it acquires at the first poll that finds the record
unchanged for leaseDuration since it saw it, up to one more period late. 19.8 s with the
defaults; chaos measured a 19.3 s takeover at load 2.5.

One deliberate addition: a holder `<pod>_<suffix>` whose pod is this process's own pod
(POD_NAME from the downward API) is an earlier run of this very container, which the
kubelet restarts only after it exited, so it is taken over at once instead of after
leaseDuration. Without POD_NAME (a process outside a pod) the rule is off.

Why not kopf's peering: it pauses operators by priority with no compare-and-swap and
compares a peer's clock with its own; a paused replica's queued work may still run. The
renew loop runs
in its own thread with its own connection, as client-go's goroutine does, so a busy event
loop or a saturated executor cannot starve it.
"""

from __future__ import annotations

import logging
import math
import os
import random
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Protocol

logger = logging.getLogger(__name__)

JITTER = 1.2  # client-go's JitterFactor for the acquire loop, and its bound on retryPeriod


class Conflict(Exception):
    """The Lease changed since it was read (HTTP 409), or already exists on create."""


class NotLeading(Exception):
    """A write was attempted by a replica that does not hold the Lease."""


@dataclass(frozen=True)
class LeaseRecord:
    """The spec of a Lease, plus the resourceVersion it was read at."""

    holder: str
    duration_seconds: int
    acquire_time: str
    renew_time: str
    transitions: int
    resource_version: str = ""


class LeaseStore(Protocol):
    """One Lease object; `timeout` bounds each request so a hung call cannot outlast the
    renew deadline (the Python client passes none by default)."""

    def get(self, timeout: float) -> LeaseRecord | None: ...

    def create(self, record: LeaseRecord, timeout: float) -> LeaseRecord: ...

    def update(self, record: LeaseRecord, timeout: float) -> LeaseRecord: ...


@dataclass(frozen=True)
class Timing:
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def __post_init__(self) -> None:
        # client-go's NewLeaderElector refuses the same combinations.
        if not self.lease_duration > self.renew_deadline:
            raise ValueError(
                f"lease duration ({self.lease_duration}s) must be greater than the renew "
                f"deadline ({self.renew_deadline}s)"
            )
        if not self.renew_deadline > JITTER * self.retry_period > 0:
            raise ValueError(
                f"renew deadline ({self.renew_deadline}s) must be greater than "
                f"{JITTER} x retry period ({self.retry_period}s), and the period above 0"
            )

    @property
    def takeover_bound(self) -> float:
        """Worst case from a leader's crash to a standby holding the Lease, API time aside."""
        return self.lease_duration + 2 * JITTER * self.retry_period


def fail_stop() -> None:
    """Exit now, without cleanup: in-flight writes die with the process. Kubernetes
    restarts the container, which comes back as a standby."""
    logging.shutdown()
    sys.stderr.flush()
    os._exit(1)


def micro_time(moment: datetime | None = None) -> str:
    """A Lease's MicroTime: RFC 3339 with microseconds, in UTC."""
    moment = moment or datetime.now(UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    def __init__(
        self,
        store: LeaseStore,
        identity: str,
        timing: Timing = Timing(),
        *,
        pod_name: str = "",
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], str] = micro_time,
        on_lost: Callable[[], None] = fail_stop,
    ):
        self.identity = identity
        self.timing = timing
        self._store = store
        self._pod = pod_name
        self._clock = clock
        self._wall = wall
        self._on_lost = on_lost
        self._observed: LeaseRecord | None = None
        self._observed_at = 0.0
        self._renewed_at: float | None = None  # when the last successful write was sent
        self._lost = False
        self._stop = threading.Event()
        self._callbacks: list[Callable[[], None]] = []
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    # --- what the rest of the operator asks ------------------------------------------

    def leading(self) -> bool:
        renewed = self._renewed_at
        return (
            not self._lost
            and renewed is not None
            and self._clock() < renewed + self.timing.renew_deadline
        )

    def check(self) -> None:
        """The gate in front of every write: raise unless this replica holds the Lease,
        and stop the process if it held it but can no longer be sure it does."""
        if self.leading():
            return
        if self._renewed_at is not None and not self._lost:
            self._lose("renew deadline passed before a write")
        raise NotLeading(f"{self.identity} does not hold the lease")

    def when_leading(self, callback: Callable[[], None]) -> None:
        """Call `callback` (from the election thread) once this replica leads; at once if
        it already does."""
        with self._lock:
            if self._renewed_at is None:
                self._callbacks.append(callback)
                return
        callback()

    # --- the election loop -----------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="leader-election", daemon=True)
        self._thread.start()

    def run(self) -> None:
        while not self._stop.is_set():
            if self.try_acquire_or_renew():
                break
            self._stop.wait(self.timing.retry_period * random.uniform(1.0, JITTER))
        else:
            return
        logger.info("became leader: %s holds the lease", self.identity)
        with self._lock:
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()
        while not self._stop.wait(self.timing.retry_period):
            if self.try_acquire_or_renew():
                continue
            if self._lost:
                return
            if not self.leading():
                self._lose(f"no renewal for {self.timing.renew_deadline:g}s")
                return

    def try_acquire_or_renew(self) -> bool:
        """One step of client-go's tryAcquireOrRenew; True when this replica holds the
        Lease afterwards."""
        sent = self._clock()
        timeout = self._request_timeout(sent)
        try:
            current = self._store.get(timeout)
        except Exception as error:  # the API is down or slow: try again next period
            logger.warning("could not read the lease: %s", error)
            return False
        now = self._wall()
        if current is None:
            fresh = LeaseRecord(self.identity, self._duration(), now, now, 0)
            return self._write(self._store.create, fresh, sent)
        if current != self._observed:
            self._observed, self._observed_at = current, self._clock()
        mine = current.holder == self.identity
        if not mine and self._renewed_at is not None:
            self._lose(f"the lease is held by {current.holder!r}")
            return False
        held = current.holder and not self._expired(current)
        if not mine and held and not self._earlier_run_of_this_pod(current.holder):
            return False
        record = LeaseRecord(
            holder=self.identity,
            duration_seconds=self._duration(),
            acquire_time=current.acquire_time if mine else now,
            renew_time=now,
            transitions=current.transitions if mine else current.transitions + 1,
            resource_version=current.resource_version,
        )
        return self._write(self._store.update, record, sent)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.timing.renew_deadline)

    def release(self) -> None:
        """Stop renewing and clear the holder. Only once every guarded write has finished:
        a write that lands after the release could race the next leader."""
        self.stop()
        was_leading = self.leading()
        self._lost = True  # from here on check() refuses every write
        if not was_leading or self._observed is None:
            return
        now = self._wall()
        empty = replace(
            self._observed, holder="", duration_seconds=1, acquire_time=now, renew_time=now
        )
        try:
            self._store.update(empty, self.timing.retry_period)
            logger.info("released the lease")
        except Exception as error:  # the standby then waits out leaseDuration instead
            logger.warning("could not release the lease: %s", error)

    # --- helpers ---------------------------------------------------------------------

    def _write(
        self, call: Callable[[LeaseRecord, float], LeaseRecord], record: LeaseRecord, sent: float
    ) -> bool:
        try:
            written = call(record, self._request_timeout(sent))
        except Conflict:
            return False  # someone else wrote first; read again next period
        except Exception as error:
            logger.warning("could not write the lease: %s", error)
            return False
        with self._lock:
            # Measured from before the request: the server committed it later, so peers'
            # view of our renewal is never older than ours.
            self._renewed_at = sent
        self._observed, self._observed_at = written, self._clock()
        return True

    def _expired(self, record: LeaseRecord) -> bool:
        return self._observed_at + record.duration_seconds <= self._clock()

    def _earlier_run_of_this_pod(self, holder: str) -> bool:
        pod, _, _ = holder.rpartition("_")
        return bool(self._pod) and pod == self._pod

    def _duration(self) -> int:
        return max(1, math.ceil(self.timing.lease_duration))

    def _request_timeout(self, now: float) -> float:
        if self._renewed_at is None:
            return self.timing.renew_deadline
        # Never wait past the deadline on a hung connection.
        return max(0.1, self._renewed_at + self.timing.renew_deadline - now)

    def _lose(self, why: str) -> None:
        self._lost = True
        logger.error("leader election lost (%s): stopping so no stale leader writes", why)
        self._on_lost()


def identity(pod_name: str) -> str:
    """client-go's shape, `<hostname>_<uuid>`: unique per process, so a restarted process
    never mistakes its predecessor's record for its own."""
    import uuid

    return f"{pod_name}_{uuid.uuid4().hex[:12]}"
