"""`trainwave logs`: which pods, in which order, under which prefix; and the printing."""

from __future__ import annotations

import io
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest
from factories import NOW, make_pod

from trainwave.controller import streaming
from trainwave.controller.streaming import LogRequest, print_logs, split_lines
from trainwave.lifecycle.logsources import LogSource, NoLogs, choose_sources, first_failed
from trainwave.lifecycle.observed import WorkerPod

pytestmark = pytest.mark.timeout(10)


def restarted_gang() -> list[WorkerPod]:
    """Attempt 0: rank 1 failed first (exit 1), rank 0 was taken down after; attempt 1 runs."""
    return [
        make_pod(0, 0, "Failed", exit_code=137, finished_at=NOW + timedelta(seconds=5)),
        make_pod(1, 0, "Failed", exit_code=1, finished_at=NOW),
        make_pod(1, 1),
        make_pod(0, 1),
    ]


def shown(sources: list[LogSource]) -> list[tuple[str, str]]:
    return [(s.pod, s.prefix) for s in sources]


@pytest.mark.parametrize(
    ("attempt", "rank", "expected"),
    [
        pytest.param(
            None, None,
            [("demo-a0-worker-1", "[a0 rank 1]"), ("demo-a1-worker-0", "[rank 0]"),
             ("demo-a1-worker-1", "[rank 1]")],
            id="current-attempt-failed-worker-first",
        ),
        pytest.param(
            None, 1, [("demo-a0-worker-1", "[a0 rank 1]"), ("demo-a1-worker-1", "[rank 1]")],
            id="rank-that-failed-keeps-its-previous-log",
        ),
        pytest.param(None, 0, [("demo-a1-worker-0", "[rank 0]")], id="rank-that-did-not-fail"),
        pytest.param(
            0, None, [("demo-a0-worker-0", "[rank 0]"), ("demo-a0-worker-1", "[rank 1]")],
            id="first-attempt-has-no-previous",
        ),
    ],
)  # fmt: skip
def test_sources_of_a_restarted_gang(
    attempt: int | None, rank: int | None, expected: list[tuple[str, str]]
) -> None:
    sources = choose_sources("demo", 1, 2, restarted_gang(), attempt=attempt, rank=rank)
    assert shown(sources) == expected
    assert [s.previous for s in sources] == [p.startswith("[a") for _, p in expected]


def test_a_gang_that_never_restarted_is_shown_in_rank_order() -> None:
    pods = [make_pod(2), make_pod(0), make_pod(1)]
    assert [s.prefix for s in choose_sources("demo", 0, 3, pods)] == [
        "[rank 0]",
        "[rank 1]",
        "[rank 2]",
    ]


def test_a_previous_attempt_that_was_disrupted_without_a_failure_adds_nothing() -> None:
    # Preempted or moved: the old pods were stopped, none failed on its own.
    pods = [make_pod(0, 0, "Succeeded", exit_code=0), make_pod(0, 1)]
    assert shown(choose_sources("demo", 1, 1, pods)) == [("demo-a1-worker-0", "[rank 0]")]


@pytest.mark.parametrize(
    ("attempt", "rank", "message"),
    [
        pytest.param(2, None, "job demo has no attempt 2: its attempts are 0..1 (pods kept for "
                     "attempts 0, 1)", id="attempt-in-the-future"),
        pytest.param(-1, None, "has no attempt -1", id="negative-attempt"),
        pytest.param(None, 2, "job demo has no rank 2: its 2 workers are ranks 0..1",
                     id="rank-out-of-range"),
    ],
)  # fmt: skip
def test_bad_choices_name_the_value_and_what_exists(
    attempt: int | None, rank: int | None, message: str
) -> None:
    with pytest.raises(NoLogs, match=message.replace("(", r"\(").replace(")", r"\)")):
        choose_sources("demo", 1, 2, restarted_gang(), attempt=attempt, rank=rank)


def test_an_attempt_whose_pods_were_deleted_says_which_are_kept() -> None:
    pods = [make_pod(0, 2, "Failed", exit_code=1), make_pod(0, 3)]
    with pytest.raises(NoLogs) as raised:
        choose_sources("demo", 3, 1, pods, attempt=1)
    assert "no pods of attempt 1 (pods kept for attempts 2, 3" in str(raised.value)


def test_the_first_failure_is_the_earliest_and_unknown_finish_times_come_last() -> None:
    late = make_pod(0, 0, "Failed", exit_code=1, finished_at=NOW + timedelta(seconds=1))
    early = make_pod(2, 0, "Failed", exit_code=1, finished_at=NOW)
    unknown = make_pod(1, 0, "Failed")  # evicted: no container termination recorded
    assert first_failed([late, unknown, early]) == early
    assert first_failed([unknown]) == unknown
    assert first_failed([make_pod(0, 0, "Succeeded", exit_code=0)]) is None


@pytest.mark.parametrize(
    ("chunks", "lines"),
    [
        pytest.param([b"a\nb\n"], ["a", "b"], id="whole-lines"),
        pytest.param([b"a", b"b\nc", b"\n"], ["ab", "c"], id="split-across-chunks"),
        pytest.param([b"a\n\nb"], ["a", "", "b"], id="blank-line-and-unterminated-last"),
        pytest.param([b"caf\xc3", b"\xa9\n"], ["caf\u00e9"], id="utf8-split-in-a-character"),
    ],
)
def test_split_lines(chunks: list[bytes], lines: list[str]) -> None:
    assert list(split_lines(iter(chunks))) == lines


def fake_logs(
    monkeypatch: pytest.MonkeyPatch, logs: dict[str, list[tuple[float, str]]]
) -> list[tuple[str, bool]]:
    """Each pod's log as (delay before the line, line); records (pod, follow) per read."""
    reads: list[tuple[str, bool]] = []

    def read(core: object, namespace: str, pod: str, follow: bool) -> Iterator[str]:
        reads.append((pod, follow))
        for delay, line in logs[pod]:
            time.sleep(delay)
            yield line

    monkeypatch.setattr(streaming, "_read", read)
    return reads


def test_without_follow_each_log_is_one_block_in_order_however_they_arrive(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sources = choose_sources("demo", 1, 2, restarted_gang())
    # Rank 0's log arrives last, the failed worker's first line in the middle.
    reads = fake_logs(monkeypatch, {
        "demo-a0-worker-1": [(0.05, "boom"), (0.0, "Traceback")],
        "demo-a1-worker-0": [(0.2, "r0 one"), (0.0, "r0 two")],
        "demo-a1-worker-1": [(0.0, "r1 one"), (0.0, "r1 two")],
    })  # fmt: skip
    out, err = io.StringIO(), io.StringIO()

    code = print_logs(None, LogRequest("ns", "demo"), sources, out, err)  # type: ignore[arg-type]

    assert code == 0
    assert out.getvalue().splitlines() == [
        "[a0 rank 1] boom",
        "[a0 rank 1] Traceback",
        "[rank 0] r0 one",
        "[rank 0] r0 two",
        "[rank 1] r1 one",
        "[rank 1] r1 two",
    ]
    assert err.getvalue() == (
        "attempt 0 failed first at rank 1 (Error, exit code 1); its log comes first\n"
    )
    assert all(not follow for _, follow in reads)


def test_follow_shows_the_failed_worker_whole_then_merges_lines_as_they_arrive(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sources = choose_sources("demo", 1, 2, restarted_gang())
    reads = fake_logs(monkeypatch, {
        "demo-a0-worker-1": [(0.0, "boom")],
        "demo-a1-worker-0": [(0.0, "r0 early"), (0.3, "r0 late")],
        "demo-a1-worker-1": [(0.15, "r1 middle")],
    })  # fmt: skip
    out = io.StringIO()

    print_logs(None, LogRequest("ns", "demo", follow=True), sources, out, io.StringIO())  # type: ignore[arg-type]

    assert out.getvalue().splitlines() == [
        "[a0 rank 1] boom",
        "[rank 0] r0 early",
        "[rank 1] r1 middle",
        "[rank 0] r0 late",
    ]
    # The finished worker is read once; only the current ones are followed.
    assert sorted(reads) == [
        ("demo-a0-worker-1", False),
        ("demo-a1-worker-0", True),
        ("demo-a1-worker-1", True),
    ]


def test_a_log_that_cannot_be_read_is_reported_for_its_rank_and_the_rest_still_print(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sources = choose_sources("demo", 0, 2, [make_pod(0), make_pod(1)])

    def read(core: object, namespace: str, pod: str, follow: bool) -> Iterator[str]:
        if pod.endswith("-0"):
            raise ConnectionResetError("connection reset by peer")
        yield "fine"

    monkeypatch.setattr(streaming, "_read", read)
    out, err = io.StringIO(), io.StringIO()

    code = print_logs(None, LogRequest("ns", "demo"), sources, out, err)  # type: ignore[arg-type]

    assert code == 1
    assert out.getvalue() == "[rank 1] fine\n"
    assert err.getvalue() == "[rank 0] log stream ended: connection reset by peer\n"
