"""The coalescing work queue. Each test runs its own event loop with `asyncio.run`."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Coroutine, Hashable
from itertools import pairwise
from typing import Any

import pytest

from trainwave.backoff import Backoff
from trainwave.kube.queue import RETRY, ItemBackoff, WorkQueue

pytestmark = pytest.mark.timeout(10)

Work = Callable[[Hashable], Awaitable[float | None]]


def run(test: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), timeout=5))


async def until(predicate: Callable[[], bool], timeout: float = 2.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.001)


async def settle(seconds: float = 0.05) -> None:
    """Let the workers pick up anything still pending."""
    await asyncio.sleep(seconds)


class Recorder:
    """The queue's work: records each run, and when it ran, by key."""

    def __init__(self, results: dict[Hashable, list[Any]] | None = None, hold: float = 0.0):
        self.runs: list[tuple[Hashable, float]] = []
        self.results = results or {}
        self.hold = hold
        self.active: dict[Hashable, int] = {}
        self.most_at_once: dict[Hashable, int] = {}
        self.most_overall = 0

    def count(self, key: Hashable) -> int:
        return sum(1 for k, _ in self.runs if k == key)

    def times(self, key: Hashable) -> list[float]:
        return [t for k, t in self.runs if k == key]

    async def __call__(self, key: Hashable) -> float | None:
        self.runs.append((key, asyncio.get_running_loop().time()))
        self.active[key] = self.active.get(key, 0) + 1
        self.most_at_once[key] = max(self.most_at_once.get(key, 0), self.active[key])
        self.most_overall = max(self.most_overall, sum(self.active.values()))
        try:
            await asyncio.sleep(self.hold)
            planned = self.results.get(key, [])
            result = planned.pop(0) if planned else None
            if isinstance(result, Exception):
                raise result
            return result
        finally:
            self.active[key] -= 1


def started(work: Work, workers: int = 2, **kwargs: Any) -> WorkQueue:
    queue = WorkQueue(work, **kwargs)
    queue.start(workers)
    return queue


def test_many_adds_coalesce_into_one_run() -> None:
    async def scenario() -> None:
        work = Recorder()
        queue = WorkQueue(work)
        for _ in range(100):
            queue.add("a")
        queue.add("b")
        assert queue.depth == 2
        queue.start(4)
        await until(lambda: len(work.runs) == 2)
        await settle()
        assert sorted(str(k) for k, _ in work.runs) == ["a", "b"]
        assert queue.depth == 0
        await queue.stop()

    run(scenario)


def test_a_key_added_while_busy_runs_once_more_after() -> None:
    async def scenario() -> None:
        release = asyncio.Event()
        calls: list[str] = []

        async def work(key: Hashable) -> None:
            calls.append(str(key))
            if len(calls) == 1:
                await release.wait()

        queue = started(work, workers=4)
        queue.add("a")
        await until(lambda: len(calls) == 1)
        for _ in range(5):
            queue.add("a")
        await settle()
        assert calls == ["a"], "a busy key is not handed to a second worker"
        release.set()
        await until(lambda: len(calls) == 2)
        await settle()
        assert calls == ["a", "a"]
        await queue.stop()

    run(scenario)


def test_a_key_never_runs_twice_at_once_but_keys_run_in_parallel() -> None:
    async def scenario() -> None:
        work = Recorder(hold=0.003)
        queue = started(work, workers=4)
        for _ in range(30):
            for key in ("a", "b", "c"):
                queue.add(key)
            await asyncio.sleep(0.001)
        await settle(0.1)
        assert work.most_at_once == {"a": 1, "b": 1, "c": 1}
        assert work.most_overall > 1
        assert all(work.count(key) >= 2 for key in "abc")
        await queue.stop()

    run(scenario)


@pytest.mark.parametrize(
    ("delays", "expected"),
    [
        pytest.param((0.2, 0.05, 0.3), 0.05, id="earlier-replaces-later"),
        pytest.param((0.05, 0.2), 0.05, id="later-keeps-earlier"),
        pytest.param((0.05, 0.05), 0.05, id="same-time-once"),
    ],
)
def test_delayed_add_keeps_the_earliest(delays: tuple[float, ...], expected: float) -> None:
    async def scenario() -> None:
        work = Recorder()
        queue = started(work)
        begin = asyncio.get_running_loop().time()
        for delay in delays:
            queue.add("a", after=delay)
        await until(lambda: work.count("a") == 1)
        await asyncio.sleep(max(delays) + 0.05)
        assert work.count("a") == 1, "a replaced timer must not fire too"
        assert work.times("a")[0] - begin >= expected
        await queue.stop()

    run(scenario)


def test_delayed_add_does_not_block_an_immediate_one() -> None:
    async def scenario() -> None:
        work = Recorder()
        queue = started(work)
        queue.add("a", after=10)
        queue.add("a")
        await until(lambda: work.count("a") == 1)
        await queue.stop()

    run(scenario)


def test_delayed_add_for_a_key_waiting_to_run_now_is_dropped() -> None:
    # A batched pod event for a job already queued: the run that comes reads it.
    async def scenario() -> None:
        work = Recorder(hold=0.05)
        queue = started(work, workers=1)
        queue.add("a")
        queue.add("a", after=0.06)  # would fire just after the run that is already due
        await until(lambda: work.count("a") == 1)
        await asyncio.sleep(0.15)
        assert work.count("a") == 1
        await queue.stop()

    run(scenario)


def spy_on_adds(queue: WorkQueue) -> list[tuple[Hashable, float]]:
    """Record every delayed add: the queue's own requeues and retries."""
    adds: list[tuple[Hashable, float]] = []
    add = queue.add

    def recording(key: Hashable, after: float = 0.0) -> None:
        if after > 0:
            adds.append((key, after))
        add(key, after)

    queue.add = recording  # type: ignore[method-assign]
    return adds


def test_failures_are_retried_with_capped_exponential_backoff(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario() -> None:
        boom = RuntimeError("boom")
        work = Recorder({"a": [boom, boom, boom, boom, None, boom]})
        queue = started(work, retry=Backoff(base=0.005, cap=0.015))  # no jitter: exact
        adds = spy_on_adds(queue)
        queue.add("a")
        await until(lambda: work.count("a") == 5)
        assert [after for _, after in adds] == [0.005, 0.01, 0.015, 0.015]
        times = work.times("a")
        for (before, after), delay in zip(
            pairwise(times), (0.005, 0.01, 0.015, 0.015), strict=True
        ):
            assert after - before >= delay
        queue.add("a")
        await until(lambda: work.count("a") == 6)
        await until(lambda: len(adds) == 5)
        assert adds[-1] == ("a", 0.005), "a success resets the backoff"
        await queue.stop()

    run(scenario)
    assert "reconcile of a failed (4 in a row)" in caplog.text


@pytest.mark.parametrize(("requeue", "runs"), [(0.03, 2), (0.0, 2), (None, 1)],
                         ids=["after-delay", "at-once", "none"])  # fmt: skip
def test_requeue_after_is_honored(requeue: float | None, runs: int) -> None:
    async def scenario() -> None:
        work = Recorder({"a": [requeue]})
        queue = started(work)
        queue.add("a")
        await until(lambda: work.count("a") == runs)
        await settle(0.08)
        assert work.count("a") == runs
        if requeue:
            first, second = work.times("a")
            assert second - first >= requeue
        await queue.stop()

    run(scenario)


def test_stop_cancels_workers_and_timers() -> None:
    async def scenario() -> None:
        work = Recorder(hold=10)
        queue = started(work)
        queue.add("busy")
        queue.add("later", after=0.02)
        await until(lambda: work.count("busy") == 1)
        await queue.stop()
        await asyncio.sleep(0.05)
        assert work.count("later") == 0

    run(scenario)


@pytest.mark.parametrize("failures", [1, 2, 3, 6, 7, 20])
def test_the_item_backoff_is_exponential_capped_and_jittered_within_its_bounds(
    failures: int,
) -> None:
    """workqueue's ItemExponentialFailureRateLimiter, plus wait.Backoff's jitter: each delay
    lies in [d, d * (1 + jitter)) where d = base * 2**(n-1) held at the cap."""
    exact = min(RETRY.base * 2 ** (failures - 1), RETRY.cap)
    seen = set()
    for seed in range(200):
        limiter = ItemBackoff(RETRY, rand=random.Random(seed).random)
        for _ in range(failures - 1):
            limiter.when("a")
        delay = limiter.when("a")
        assert exact <= delay < exact * (1 + RETRY.jitter)
        seen.add(round(delay, 6))
    assert len(seen) > 150, "keys that failed together must not all retry together"
    lowest = ItemBackoff(RETRY, rand=lambda: 0.0)
    highest = ItemBackoff(RETRY, rand=lambda: 0.999999)
    for _ in range(failures):
        low, high = lowest.when("a"), highest.when("a")
    assert low == exact
    assert high == pytest.approx(exact * (1 + RETRY.jitter), rel=1e-5)


def test_the_item_backoff_counts_per_key_and_forget_starts_over() -> None:
    limiter = ItemBackoff(Backoff(base=1.0, cap=60.0))
    assert [limiter.when("a") for _ in range(3)] == [1.0, 2.0, 4.0]
    assert limiter.when("b") == 1.0, "another key's failures do not count"
    assert (limiter.requeues("a"), limiter.requeues("b"), len(limiter)) == (3, 1, 2)
    limiter.forget("a")
    assert (limiter.requeues("a"), limiter.when("a")) == (0, 1.0)


def test_add_rate_limited_waits_the_limiter_s_delay() -> None:
    async def scenario() -> None:
        work = Recorder()
        queue = started(work, limiter=ItemBackoff(Backoff(base=0.02, cap=1.0)))
        loop = asyncio.get_running_loop()
        began = loop.time()
        assert queue.add_rate_limited("a") == 0.02
        assert queue.add_rate_limited("a") == 0.04, "the second failure in a row waits longer"
        await until(lambda: work.count("a") == 1)
        assert work.times("a")[0] - began >= 0.02, "the earliest of the delayed adds wins"
        await settle(0.08)
        assert work.count("a") == 1, "two delayed adds of one key run once"
        await queue.stop()

    run(scenario)
