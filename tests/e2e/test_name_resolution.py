"""What the later headless Service relies on: torch's rendezvous retries a name that does not
resolve yet, and connects once it does.

The operator creates a job's Service once every worker has an address, so a worker can
look MASTER_ADDR up before its DNS record exists. Here a TCPStore client runs in its own
mount namespace with a hosts file that lacks the name; the name is added two seconds
after the client started connecting, and the client must then reach the store.

Why not on the real node: there a name asked before it exists stays unresolvable for the
30 s CoreDNS caches its NXDOMAIN (tests/benchmarks/dns_negative_cache.py), so a gap of
two seconds cannot be held open on purpose.
The real node's own test of the same path is test_training.py (MASTER_ADDR is a name
that only CoreDNS resolves). This test needs root and `unshare`; without them it fails.
"""

from __future__ import annotations

import datetime
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch.distributed as dist

pytestmark = pytest.mark.timeout(90)

NAME = "demo-worker-0.demo"
CLIENT = """
import datetime, sys, time
import torch.distributed as dist
print("connecting", flush=True)
started = time.monotonic()
store = dist.TCPStore(sys.argv[1], int(sys.argv[2]), 2, False,
                      timeout=datetime.timedelta(seconds=40))
print(store.get("greeting").decode(), round(time.monotonic() - started, 2), flush=True)
"""


def test_a_rendezvous_retries_a_name_until_it_resolves(tmp_path: Path) -> None:
    # Fails, not skips: CI must see that the e2e tier could not run.
    assert os.geteuid() == 0, "needs root (a private mount namespace over /etc/hosts)"
    assert shutil.which("unshare"), "needs `unshare` (util-linux) on PATH"
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1\tlocalhost\n")
    script = tmp_path / "client.py"
    script.write_text(CLIENT)
    store = dist.TCPStore(
        "127.0.0.1", 0, 2, True, timeout=datetime.timedelta(seconds=40), wait_for_workers=False
    )
    store.set("greeting", "hello")
    inner = f"mount --bind {hosts} /etc/hosts && exec {sys.executable} {script} {NAME} {store.port}"
    client = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", inner],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert client.stdout is not None
        assert client.stdout.readline().strip() == "connecting"
        time.sleep(2)
        assert client.poll() is None, "the client gave up on a name that did not resolve"
        with hosts.open("r+") as stream:  # in place: the bind mount holds this inode
            stream.seek(0, 2)
            stream.write(f"127.0.0.1\t{NAME}\n")
        out, err = client.communicate(timeout=60)
    finally:
        client.kill()
    assert client.returncode == 0, err[-2000:]
    greeting, seconds = out.split()
    assert greeting == "hello"
    assert float(seconds) >= 2.0, "connected before the name existed?"
