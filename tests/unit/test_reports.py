"""Worker runtime reports -> status.progress and the RDMAVerified condition."""

from __future__ import annotations

from typing import Any

import pytest
from factories import NOW, make_job, running

from trainwave.api.status import ConditionType
from trainwave.controller.reporting import parse_networks
from trainwave.lifecycle.decide import decide
from trainwave.lifecycle.reports import progress_status, rdma_verdict, read_report
from trainwave.resolving import resolve_job

pytestmark = pytest.mark.timeout(20)


def document(rank: int = 0, *, nccl: str | None = "PASS", fail: str | None = None,
             progress: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
    checks = [{"name": "memlock", "status": "PASS", "reason": "unlimited"}]
    if nccl is not None:
        checks.append({"name": "nccl_transport", "status": nccl, "reason": f"nccl says {nccl}"})
    if fail is not None:
        checks.append({"name": fail, "status": "FAIL", "reason": "broken"})
    verdict = "FAIL" if fail else "PASS"
    return {
        "node_rank": rank,
        "doctor": {"verdict": verdict, "checks": checks},
        "progress": progress,
    }


def reports(*documents: dict[str, Any]) -> dict[int, Any]:
    found = {}
    for d in documents:
        report = read_report(d)
        assert report is not None
        found[report.node_rank] = report
    return found


@pytest.mark.parametrize(
    ("documents", "expected"),
    [
        ((document(0), document(1)), ("True", "GPUDirectInUse")),
        ((document(0), document(1, nccl="FAIL")), ("False", "NotGPUDirect")),
        ((document(0), document(1, nccl="WARN")), ("False", "NotGPUDirect")),
        ((document(0, fail="memlock_or_ipc_lock"), document(1)), ("False", "DoctorFailed")),
        ((document(0), document(1, nccl="SKIP")), ("Unknown", "WaitingForProof")),
        ((document(0),), ("Unknown", "WaitingForProof")),
    ],
    ids=[
        "all-proven",
        "tcp-fallback",
        "ib-without-gdr",
        "doctor-fail",
        "no-log-yet",
        "one-missing",
    ],
)
def test_rdma_verdict(documents: tuple[dict[str, Any], ...], expected: tuple[str, str]) -> None:
    status, reason, message = rdma_verdict(reports(*documents), workers=2)
    assert (status, reason) == expected
    if status == "False":
        assert message.startswith("worker ")


def test_not_a_status_document_is_ignored() -> None:
    assert read_report({"hello": 1}) is None
    assert read_report({"node_rank": 0, "doctor": "garbage", "progress": []}) is not None


def test_progress_comes_from_rank_zero_with_a_summary_for_kubectl() -> None:
    progress = {
        "step": 120,
        "total_steps": 1000,
        "samples_per_second": 812.4,
        "loss": 0.25,
        "eta_seconds": 330.0,
    }
    found = progress_status(reports(document(0, progress=progress), document(1)))
    assert found is not None
    assert (found.step, found.total_steps, found.loss) == (120, 1000, 0.25)
    assert found.summary == "step 120/1000, 812 samples/s, ETA 5m30s"
    assert progress_status(reports(document(1, progress=progress))) is None


def test_decide_writes_progress_and_rdma_verified_for_an_rdma_job() -> None:
    job = make_job(phase="Running", network={"rdma": {}})
    found = decide(
        resolve_job(job),
        running(),
        NOW,
        reports=reports(document(0, progress={"step": 5}), document(1)),
    )
    assert found.status.progress is not None
    assert found.status.progress.step == 5
    condition = found.status.condition(ConditionType.RDMA_VERIFIED)
    assert condition is not None
    assert (condition.status, condition.reason) == ("True", "GPUDirectInUse")


def test_no_rdma_asked_no_rdma_condition() -> None:
    found = decide(
        resolve_job(make_job(phase="Running")), running(), NOW, reports=reports(document(0))
    )
    assert found.status.condition(ConditionType.RDMA_VERIFIED) is None


# The poller and its hardened channel: test_status_channel.py.


def test_bad_status_networks_are_refused_with_the_value() -> None:
    with pytest.raises(ValueError, match=r"--status-networks: .*10\.0\.0\.0/33"):
        parse_networks("10.0.0.0/33")
