"""runPolicy.preflight with real processes over a real, slowed link: no cluster needed.

Two "workers" in network namespaces this test creates, joined by one veth pair (no
route out, no address beyond 10.99.0.0/24); the link INTO worker 1 slowed with a token
bucket (tc tbf: this kernel has no netem). Each worker runs the launcher's own preflight
(runtime/launcher/preflight.py: torch.distributed.run, 2 processes, gloo) exactly as in a
pod, and the operator's pure verdict (lifecycle/preflight.py) over the two /status
documents must name worker 1. The same in pods on real nodes, with the re-placement:
tests/e2e/realnode/test_preflight_nodes.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from trainwave.api.run_policy import Preflight
from trainwave.lifecycle.preflight import judge
from trainwave.lifecycle.reports import read_preflight

REPO = Path(__file__).resolve().parents[2]
RATE = "200mbit"  # 0.2 Gbit/s into worker 1; loopback-speed veths carry several Gbit/s

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(
        os.geteuid() != 0 or not shutil.which("tc") or not shutil.which("ip"),
        reason="needs root, ip and tc to make network namespaces and shape a link",
    ),
]


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@pytest.fixture
def two_workers() -> Iterator[tuple[str, str]]:
    tag = uuid.uuid4().hex[:6]
    spaces = (f"twpf{tag}0", f"twpf{tag}1")
    for space in spaces:
        ip("netns", "add", space)
    try:
        ip("link", "add", f"pf{tag}0", "netns", spaces[0], "type", "veth", "peer", "name",
           f"pf{tag}1", "netns", spaces[1])  # fmt: skip
        for index, space in enumerate(spaces):
            ip("-n", space, "addr", "add", f"10.99.0.{index + 1}/24", "dev", f"pf{tag}{index}")
            ip("-n", space, "link", "set", "lo", "up")
            ip("-n", space, "link", "set", f"pf{tag}{index}", "up")
        # Worker 0's egress on the pair is the link into worker 1.
        subprocess.run(
            ["ip", "netns", "exec", spaces[0], "tc", "qdisc", "add", "dev", f"pf{tag}0",
             "root", "tbf", "rate", RATE, "burst", "64kb", "latency", "500ms"],
            check=True,
        )  # fmt: skip
        yield spaces
    finally:
        for space in spaces:
            subprocess.run(["ip", "netns", "del", space], check=False)


LAUNCHER = """
import json, os, sys
from pathlib import Path
from trainwave.runtime.launcher import preflight
environ = dict(os.environ)
found = preflight.run_preflight(
    preflight.config_from(environ), environ, Path(sys.argv[1]), 0, lambda document: None
)
print("STATUS " + json.dumps(found))
"""


def launcher(space: str, node: int, report_dir: Path, found: dict[int, Any]) -> None:
    device = f"pf{space[4:-1]}{node}"
    env = os.environ | {
        # In a pod the hostname resolves to the pod's address; here gloo is told the device.
        "GLOO_SOCKET_IFNAME": device,
        "PYTHONPATH": str(REPO / "operator"),
        "PET_NNODES": "2",
        "PET_NODE_RANK": str(node),
        "PET_NPROC_PER_NODE": "2",
        "PET_MASTER_ADDR": "10.99.0.1",
        "PET_MASTER_PORT": "29500",
        "OMP_NUM_THREADS": "1",
        "TRAINWAVE_PREFLIGHT_SIZE_MIB": "8",
        "TRAINWAVE_PREFLIGHT_TIMEOUT_SECONDS": "120",
        "TRAINWAVE_REPORT_DIR": str(report_dir),
    }
    done = subprocess.run(
        ["ip", "netns", "exec", space, sys.executable, "-c", LAUNCHER, str(report_dir)],
        env=env, capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    lines = [line for line in done.stdout.splitlines() if line.startswith("STATUS ")]
    found[node] = json.loads(lines[0].removeprefix("STATUS ")) if lines else done.stderr[-3000:]


def test_the_worker_behind_a_slowed_link_is_named(
    two_workers: tuple[str, str], tmp_path: Path
) -> None:
    found: dict[int, Any] = {}
    threads = [
        threading.Thread(target=launcher, args=(space, node, tmp_path / str(node), found))
        for node, space in enumerate(two_workers)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(isinstance(document, dict) for document in found.values()), found
    assert [sorted(found[n]["ranks"]) for n in (0, 1)] == [["0", "1"], ["2", "3"]], found
    assert all(found[n]["error"] is None and found[n]["done"] for n in (0, 1)), found
    verdict = judge({n: read_preflight(d) for n, d in found.items()}, 2, 0, Preflight())
    assert verdict is not None
    assert verdict.measure == "sendrecv_gbps"
    assert [(s.worker, s.rank in (2, 3)) for s in verdict.slow] == [(1, True)], (verdict, found)
    # 2 ranks share the 0.2 Gbit/s link into worker 1
    assert all(r["sendrecv_gbps"] < 0.2 for r in found[1]["ranks"].values()), found
    print(json.dumps(found), verdict)
