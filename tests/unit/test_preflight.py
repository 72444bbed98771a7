"""runPolicy.preflight: the verdict (which worker, which floor), what the job does with it
(condition, Event, node mark, re-placement, the bound on failures in a row), the reader of
the tenant-written /status key, and the runtime's arithmetic and rendezvous variables."""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from factories import NOW, ago, make_body, make_pod

from trainwave import contract
from trainwave.api.reasons import Reason
from trainwave.api.run_policy import Preflight
from trainwave.api.status import ConditionType, Phase
from trainwave.api.trainingjob import parse_trainingjob
from trainwave.lifecycle.decide import Decision, decide
from trainwave.lifecycle.preflight import judge
from trainwave.lifecycle.reports import PreflightReport, WorkerReport, read_preflight, read_report
from trainwave.resolving import resolve_job
from trainwave.runtime import preflight as measuring
from trainwave.runtime.launcher import preflight as launching

pytestmark = pytest.mark.timeout(20)


def reports_of(
    worker_ranks: dict[int, dict[int, float]],
    *,
    key: str = "sendrecv_gbps",
    attempt: int = 0,
    error: str | None = None,
) -> dict[int, PreflightReport | None]:
    """{worker: {rank: Gbit/s}} -> the reports the operator reads."""
    found = {}
    for worker, ranks in worker_ranks.items():
        document = {
            "attempt": attempt,
            "done": True,
            "error": error,
            "ranks": {str(r): {"bus_gbps": 3.0, key: v} for r, v in ranks.items()},
        }
        found[worker] = read_preflight(document)
    return found  # fmt: skip


@pytest.mark.parametrize(
    ("ranks", "policy", "slow"),
    [
        ({0: {0: 10, 1: 10}, 1: {2: 10, 3: 9}}, {}, []),
        ({0: {0: 10, 1: 10}, 1: {2: 1, 3: 1.2}}, {}, [(1, 2)]),
        # one slow process is not a slow node: the worker's figure is its ranks' median
        ({0: {0: 10, 1: 10, 2: 10}, 1: {3: 10, 4: 10, 5: 1}}, {}, []),
        ({0: {0: 10}, 1: {1: 9}, 2: {2: 3}}, {"minFractionOfMedian": 0.5}, [(2, 2)]),
        ({0: {0: 10}, 1: {1: 9}}, {"minBusGbps": 9.5}, [(1, 1)]),
        ({0: {0: 10}, 1: {1: 9}}, {"minBusGbps": 20}, [(1, 1), (0, 0)]),
    ],
    ids=["even", "slow-worker-of-two", "one-slow-process", "of-three", "floor", "both-floor"],
)
def test_which_worker_fails(
    ranks: dict[int, dict[int, float]], policy: dict[str, Any], slow: list[tuple[int, int]]
) -> None:
    verdict = judge(reports_of(ranks), len(ranks), 0, Preflight.model_validate(policy))
    assert verdict is not None
    assert [(s.worker, s.rank) for s in verdict.slow] == slow
    assert verdict.passed is (not slow)


def test_with_two_workers_the_slow_one_is_judged_against_the_other_not_the_gang() -> None:
    # The gang's median (5.5) would put 1 Gbit/s at 0.18 and 10 at 1.8: both named or
    # neither with other floors; against the other worker only the slow one falls below.
    verdict = judge(reports_of({0: {0: 10}, 1: {1: 1}}), 2, 0, Preflight())
    assert verdict is not None
    (slow,) = verdict.slow
    assert (slow.worker, slow.gbps, slow.floor) == (1, 1.0, 5.0)
    assert "0.5 x the other workers' median 10 Gbit/s" in slow.why


def test_all_reduce_figures_when_a_rank_has_no_send_receive() -> None:
    verdict = judge(
        reports_of({0: {0: 10, 1: 10}}, key="bus_gbps"), 1, 0, Preflight(min_bus_gbps=20)
    )
    assert verdict is not None
    assert verdict.measure == "bus_gbps"
    assert [s.worker for s in verdict.slow] == [0]


@pytest.mark.parametrize(
    ("reports", "attempt"),
    [
        ({0: None}, 0),
        ({0: PreflightReport(attempt=0, done=False), 1: PreflightReport(attempt=0, done=False)},
         0),
        ({0: PreflightReport(attempt=None, done=True), 1: PreflightReport(attempt=0, done=True)},
         0),
        (reports_of({0: {0: 1}, 1: {1: 9}}), 1),
    ],
    ids=["worker-missing", "running", "no-attempt", "other-attempt"],
)  # fmt: skip
def test_no_verdict_until_every_worker_of_this_attempt_finished(
    reports: dict[int, PreflightReport | None], attempt: int
) -> None:
    assert judge(reports, 2, attempt, Preflight()) is None


def test_a_launcher_error_gives_no_figures_and_no_verdict_on_nodes() -> None:
    reports = reports_of({0: {0: 10}, 1: {}}, error=None)
    reports[1] = read_preflight({"attempt": 0, "done": True, "error": "timed out", "ranks": {}})
    verdict = judge(reports, 2, 0, Preflight())
    assert verdict is not None
    assert (verdict.passed, verdict.slow, verdict.errors) == (False, (), ("worker 1: timed out",))


@pytest.mark.parametrize(
    "document",
    [None, [], {"done": "yes"}, {"done": True, "attempt": True, "ranks": {"x": {}, "1": 5}},
     {"done": True, "attempt": 0, "ranks": {"1": {"bus_gbps": "fast", "sendrecv_gbps": -1}}},
     {"done": True, "attempt": 0, "ranks": {"1": {"bus_gbps": float("inf")}}}],
    ids=["none", "list", "done-not-bool", "bad-keys", "bad-values", "infinite"],
)  # fmt: skip
def test_the_reader_drops_what_is_malformed(document: Any) -> None:
    found = read_preflight(document)
    if found is not None:
        assert all(bw.bus_gbps is None and bw.sendrecv_gbps is None for bw in found.ranks.values())
        assert found.attempt in (None, 0)


def decide_with(
    worker_ranks: dict[int, dict[int, float]],
    *,
    preflight: dict[str, Any] | None = None,
    status: dict[str, Any] | None = None,
    max_disruptions: int = 5,
) -> Decision:
    body = make_body(
        phase="Running",
        start_time=ago(100),
        failure_policy={"maxDisruptions": max_disruptions},
        status_extra={**(status or {}), "conditions": [
            {"type": "Running", "status": "True", "reason": "AllWorkersRunning"}]},
    )  # fmt: skip
    body["spec"]["runPolicy"]["preflight"] = {"enabled": True, **(preflight or {})}
    job = parse_trainingjob(body)
    pods = [make_pod(0, placed_node="node-a"), make_pod(1, placed_node="node-b")]
    reports: dict[int, WorkerReport] = {}
    for worker, found in reports_of(worker_ranks).items():
        read = read_report(
            {
                "node_rank": worker,
                "preflight": {
                    "attempt": 0,
                    "done": True,
                    "error": None,
                    "ranks": {
                        str(r): {"sendrecv_gbps": v} for r, v in worker_ranks[worker].items()
                    },
                },
            }
        )
        assert read is not None
        assert found is not None
        reports[worker] = read
    return decide(resolve_job(job), pods, NOW, reports=reports)  # fmt: skip


def test_a_slow_node_is_named_marked_and_the_gang_replaced_as_a_disruption() -> None:
    found = decide_with({0: {0: 10, 1: 11}, 1: {2: 2, 3: 2.5}})
    assert found.mark_nodes == (("node-b", NOW + timedelta(seconds=3600)),)
    assert (found.status.phase, found.status.reason) == (Phase.RESTARTING, Reason.PREFLIGHT_FAILED)
    assert (found.status.disruptions, found.status.restarts, found.status.attempt) == (1, 0, 1)
    assert len(found.delete_pods) == 2
    condition = found.status.condition(ConditionType.PREFLIGHT)
    assert condition is not None
    assert (condition.status, condition.reason) == ("False", Reason.PREFLIGHT_FAILED)
    assert "worker 1 (pod demo-a0-worker-1, node node-b), rank 2: 2.25 Gbit/s, below 5.25" in (
        condition.message
    )
    assert f"{contract.ANNOTATION_STRAGGLER_UNTIL}=2026-01-01T13:00:00Z" in condition.message
    assert found.status.preflight is not None
    assert (found.status.preflight.attempt, found.status.preflight.failures) == (0, 1)
    assert Reason.PREFLIGHT_FAILED in [e.reason for e in found.events]


def test_a_pass_is_a_true_condition_and_an_event_judged_once() -> None:
    found = decide_with({0: {0: 10, 1: 11}, 1: {2: 9, 3: 10}})
    condition = found.status.condition(ConditionType.PREFLIGHT)
    assert condition is not None
    assert (condition.status, condition.reason) == (
        "True",
        Reason.PREFLIGHT_PASSED,
    )
    assert "sendrecv_gbps, slowest rank 2 9 Gbit/s, median 10 Gbit/s" in condition.message
    assert found.status.phase == Phase.RUNNING
    assert not found.mark_nodes
    again = decide_with(
        {0: {0: 10, 1: 11}, 1: {2: 1, 3: 1}},
        status={"preflight": found.status.preflight.model_dump(by_alias=True)},  # type: ignore[union-attr]
    )
    assert again.status.phase == Phase.RUNNING
    assert not again.mark_nodes


@pytest.mark.parametrize(
    ("options", "why"),
    [
        ({"status": {"preflight": {"attempt": -1, "passed": False, "failures": 2}}},
         "3 tests failed in a row (maxFailures 3)"),
        ({"status": {"disruptions": 2}, "max_disruptions": 2}, "maxDisruptions (2) is spent"),
    ],
    ids=["max-failures", "disruptions-spent"],
)  # fmt: skip
def test_bounded_the_gang_then_trains_where_it_is_and_says_why(
    options: dict[str, Any], why: str
) -> None:
    found = decide_with({0: {0: 10}, 1: {1: 1}}, **options)
    assert found.status.phase == Phase.RUNNING
    assert not found.mark_nodes
    assert not found.delete_pods
    condition = found.status.condition(ConditionType.PREFLIGHT)
    assert condition is not None
    assert condition.reason == Reason.PREFLIGHT_FAILURES_EXCEEDED
    assert f"{why}: the gang trains where it is" in condition.message


def test_off_by_default_nothing_is_judged() -> None:
    body = make_body(phase="Running", start_time=ago(100))
    job = parse_trainingjob(body)
    assert job.spec.run_policy.preflight.enabled is False
    report = read_report({"node_rank": 0, "preflight": {"attempt": 0, "done": True,
                          "ranks": {"0": {"sendrecv_gbps": 0.001}}}})  # fmt: skip
    found = decide(resolve_job(job), [make_pod(0), make_pod(1)], NOW, reports={0: report})  # type: ignore[dict-item]
    assert found.status.preflight is None
    assert not found.mark_nodes


def test_nccl_tests_bus_bandwidth() -> None:
    # 1 GiB in 1 s over 4 ranks: algbw 8.59 Gbit/s, busbw x 2*3/4.
    size = 1024**3
    assert measuring.allreduce_bus_gbps(size, 1.0, 4) == pytest.approx(8.589934592 * 1.5)
    assert measuring.allreduce_bus_gbps(size, 1.0, 1) == pytest.approx(8.589934592)
    assert measuring.sendrecv_gbps(size, 2.0) == pytest.approx(4.294967296)
    assert measuring.ring_peers(1, 4, 2) == (3, 3)
    assert measuring.ring_peers(0, 6, 2) == (2, 4)
    assert measuring.ring_peers(0, 2, 2) is None


@pytest.mark.parametrize("workers", range(2, 10))
def test_no_worker_sends_and_receives_in_the_same_phase(workers: int) -> None:
    # The acknowledgements of a worker's receive leave on the link its own send fills.
    for phase in range(measuring.phases(workers)):
        senders = {w for w in range(workers) if measuring.send_phase(w, workers) == phase}
        receivers = {(w + 1) % workers for w in senders}
        assert senders, (workers, phase)
        assert not senders & receivers, (workers, phase, senders)
    assert {measuring.send_phase(w, workers) for w in range(workers)} == set(
        range(measuring.phases(workers))
    )


def test_the_test_has_its_own_static_rendezvous_and_port() -> None:
    environ = {
        contract.ENV_PET_MASTER_ADDR: "demo-worker-0.demo",
        contract.ENV_PET_MASTER_PORT: "29500",
        contract.ENV_PET_RDZV_BACKEND: "c10d",
        contract.ENV_PET_RDZV_ENDPOINT: "demo-worker-0.demo:29501",
        contract.ENV_PET_MAX_RESTARTS: "3",
        contract.ENV_STATUS_PORT: "29502",
        contract.ENV_PREFLIGHT_SIZE_MIB: "16",
    }
    env = launching.preflight_env(environ)
    assert contract.ENV_PET_RDZV_BACKEND not in env
    assert contract.ENV_PET_RDZV_ENDPOINT not in env
    assert env[contract.ENV_PET_MASTER_PORT] == "29503"  # 29501, 29502 are taken
    assert env[contract.ENV_PET_MAX_RESTARTS] == "0"
    assert launching.config_from(environ) == launching.PreflightConfig(16, 120.0)
    assert launching.config_from({}) is None


@pytest.mark.parametrize(
    ("code", "error"),
    [
        ("import time; time.sleep(30)", "the test did not finish within 1s"),
        ("raise SystemExit(3)", "the test exited with code 3"),
        ("pass", None),
    ],
    ids=["timeout", "failed", "passed"],
)
def test_the_launcher_reports_the_test_and_never_raises(
    code: str, error: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "preflight-rank-0.json").write_text('{"rank": 0, "bus_gbps": 9}')  # stale
    command = [sys.executable, "-c", code]
    monkeypatch.setattr(launching, "preflight_command", lambda: command)
    if error is None:  # a test that wrote its figures
        line = "; ".join([
            "import json, pathlib", f"p = pathlib.Path({str(tmp_path)!r})",
            "(p / 'preflight-rank-2.json').write_text(json.dumps({'rank': 2, 'bus_gbps': 3.5,"
            " 'sendrecv_gbps': 9.25, 'other': 1}))",
        ])  # fmt: skip
        command[-1] = line
    seen: list[dict[str, Any]] = []
    config = launching.PreflightConfig(size_mib=1, timeout_seconds=1.0)
    found = launching.run_preflight(config, {}, tmp_path, 2, seen.append)
    assert seen[0]["done"] is False
    assert seen[-1] == found
    assert found["done"] is True
    assert found["attempt"] == 2
    assert (found["error"] or "").startswith(error or "")
    assert (found["error"] is None) is (error is None)
    expected = {"2": {"bus_gbps": 3.5, "sendrecv_gbps": 9.25}} if error is None else {}
    assert found["ranks"] == expected  # the stale file of an earlier container is gone
