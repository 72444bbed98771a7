"""Worker runtime reports -> status.progress and the RDMAVerified condition; the poller."""

from __future__ import annotations

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from factories import NOW, make_job, running

from trainwave.api.status import ConditionType
from trainwave.controller.reporting import StatusPoller, Targets, parse_networks
from trainwave.lifecycle.decide import decide
from trainwave.lifecycle.reports import progress_status, rdma_verdict, read_report

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
        job, running(), NOW, reports=reports(document(0, progress={"step": 5}), document(1))
    )
    assert found.status.progress is not None
    assert found.status.progress.step == 5
    condition = found.status.condition(ConditionType.RDMA_VERIFIED)
    assert condition is not None
    assert (condition.status, condition.reason) == ("True", "GPUDirectInUse")


def test_no_rdma_asked_no_rdma_condition() -> None:
    found = decide(make_job(phase="Running"), running(), NOW, reports=reports(document(0)))
    assert found.status.condition(ConditionType.RDMA_VERIFIED) is None


# --- the poller --------------------------------------------------------------------------------


class _Status(BaseHTTPRequestHandler):
    body = b""

    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *_: Any) -> None:
        pass


def test_the_poller_reads_allowed_workers_and_wakes_the_job() -> None:
    handler = type("Handler", (_Status,), {"body": json.dumps(document(0)).encode()})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    woken: list[Any] = []

    async def scenario() -> dict[int, Any]:
        poller = StatusPoller(woken.append, networks=parse_networks("127.0.0.0/8"), interval=0.05)
        # 10.1.2.3 is outside the allowed networks: never contacted.
        poller.track(("ns", "job"), Targets(0, {0: ("127.0.0.1", port), 1: ("10.1.2.3", port)}))
        task = asyncio.create_task(poller.run())
        for _ in range(100):
            if woken:
                break
            await asyncio.sleep(0.02)
        task.cancel()
        return poller.reports(("ns", "job"), attempt=0)

    try:
        found = asyncio.run(scenario())
    finally:
        server.shutdown()
    assert woken == [("ns", "job")]
    assert set(found) == {0}
    assert found[0].nccl == ("PASS", "nccl says PASS")


def test_bad_status_networks_are_refused_with_the_value() -> None:
    with pytest.raises(ValueError, match=r"--status-networks: .*10\.0\.0\.0/33"):
        parse_networks("10.0.0.0/33")
