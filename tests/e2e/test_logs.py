"""End to end: `trainwave logs` reads real workers' output through the API server.

The workers are containers on the real node (the Debian Python base image, no torch);
their output reaches the CLI the way it does in any cluster: the API server's pods/log,
proxied to the real kubelet, which reads containerd's log files. The CLI runs as a user
would run it, a separate process with only a kubeconfig.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from cluster.controlplane import Cluster
from e2e.conftest import ON_REAL_NODE, WORKER_IMAGE, Release
from integration.trainwave_fixtures import (
    apply,
    job_manifest,
    wait_for_phase,
    wait_until,
    worker_pods,
)
from trainwave import contract

OPERATOR = Path(__file__).resolve().parents[2] / "operator"

# Four lines a quarter second apart, then: attempt 0's rank 1 fails (exit 3) while
# rank 0 still runs, so rank 1 is the failure that restarts the gang.
WORKER = textwrap.dedent(f"""
    import os, sys, time
    rank, attempt = os.environ["{contract.ENV_NODE_RANK}"], os.environ["{contract.ENV_ATTEMPT}"]
    for line in range(4):
        print(f"attempt {{attempt}} line {{line}}", flush=True)
        time.sleep(0.25)
    if attempt == "0" and rank == "1":
        print("boom: rank 1 gives up", flush=True)
        sys.exit(3)
    if attempt == "0":
        time.sleep(60)
    print("done", flush=True)
""")


def logs_job(name: str, script: str) -> dict[str, Any]:
    return job_manifest(
        name,
        workers=2,
        gpus=1,
        result=None,
        image=WORKER_IMAGE,
        command=["python", "-c", script],
        template_spec={"nodeSelector": ON_REAL_NODE},
    )


def trainwave_logs(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    environment = os.environ | {"KUBECONFIG": str(cluster.kubeconfig), "PYTHONPATH": str(OPERATOR)}
    command = [sys.executable, "-c", "import sys; from trainwave.cli import main; sys.exit(main())"]
    return subprocess.run(
        [*command, "logs", *args],
        capture_output=True, text=True, env=environment, timeout=60, check=False,
    )  # fmt: skip


def lines(rank: int, attempt: int, prefix: str = "") -> list[str]:
    head = prefix or f"[rank {rank}]"
    return [f"{head} attempt {attempt} line {n}" for n in range(4)]


@pytest.mark.timeout(180)
def test_logs_of_a_restarted_gang_show_the_failed_worker_first(
    release: Release,
    namespace: str,
) -> None:
    apply(release.cluster, namespace, logs_job("restart", WORKER))
    done = wait_for_phase(
        release.cluster, namespace, "restart", ("Succeeded", "Failed"), timeout=120
    )
    assert done["status"]["phase"] == "Succeeded", done["status"]
    assert (done["status"]["attempt"], done["status"]["restarts"]) == (1, 1)

    shown = trainwave_logs(release.cluster, "restart", "-n", namespace)

    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines() == [
        *lines(1, 0, prefix="[a0 rank 1]"),
        "[a0 rank 1] boom: rank 1 gives up",
        *lines(0, 1),
        "[rank 0] done",
        *lines(1, 1),
        "[rank 1] done",
    ]
    assert "attempt 0 failed first at rank 1 (Error, exit code 3)" in shown.stderr

    one = trainwave_logs(release.cluster, "restart", "-n", namespace, "--rank", "0")
    assert one.stdout.splitlines() == [*lines(0, 1), "[rank 0] done"], one.stderr

    first = trainwave_logs(release.cluster, "restart", "-n", namespace, "--attempt", "0")
    assert first.returncode == 0, first.stderr
    assert "[rank 1] boom: rank 1 gives up" in first.stdout.splitlines()


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "case",
    [
        pytest.param((["nope"], "no TrainingJob nope in namespace {ns} (jobs there: quick)"),
                     id="unknown-job"),
        pytest.param((["quick", "--rank", "5"], "job quick has no rank 5: its 2 workers are "
                      "ranks 0..1"), id="rank-out-of-range"),
        pytest.param((["quick", "--attempt", "3"], "job quick has no attempt 3: its attempts "
                      "are 0..0 (pods kept for attempts 0)"), id="no-such-attempt"),
    ],
)  # fmt: skip
def test_logs_refuses_what_the_job_does_not_have(
    release: Release,
    namespace: str,
    case: tuple[list[str], str],
) -> None:
    args, message = case
    apply(release.cluster, namespace, logs_job("quick", "print('hi')"))
    wait_until(lambda: len(worker_pods(release.cluster, namespace, "quick")) == 2, 30,
               "the gang's pods")  # fmt: skip

    refused = trainwave_logs(release.cluster, *args, "-n", namespace)

    assert refused.returncode == 2
    assert refused.stderr == f"trainwave logs: {message.format(ns=namespace)}\n"


@pytest.mark.timeout(120)
def test_follow_merges_the_workers_lines_as_they_arrive(
    release: Release,
    namespace: str,
) -> None:
    # The two containers may start seconds apart (seen: more than the 3 s of ticks, with
    # the chaos tier beside this one), so they meet first: worker 0 listens on its
    # rendezvous port, worker 1 connects, then both tick. Merging is what is tested.
    ticking = textwrap.dedent(f"""
        import os, socket, time
        rank = os.environ["{contract.ENV_NODE_RANK}"]
        address, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
        if rank == "0":
            with socket.create_server(("", port)) as server:
                server.accept()[0].close()
        else:
            while True:
                try:
                    socket.create_connection((address, port), timeout=2).close()
                    break
                except OSError:
                    time.sleep(0.2)
        for tick in range(10):
            print(f"tick {{tick}}", flush=True)
            time.sleep(0.3)
    """)
    apply(release.cluster, namespace, logs_job("ticks", ticking))
    # Followed from before the workers start: it waits for them instead of ending empty.
    wait_until(lambda: len(worker_pods(release.cluster, namespace, "ticks")) == 2, 30,
               "the gang's pods")  # fmt: skip
    began = time.monotonic()

    followed = trainwave_logs(release.cluster, "ticks", "-n", namespace, "--follow")

    assert followed.returncode == 0, followed.stderr
    got = followed.stdout.splitlines()
    for rank in (0, 1):
        assert [line for line in got if line.startswith(f"[rank {rank}]")] == [
            f"[rank {rank}] tick {n}" for n in range(10)
        ]
    # Merged as they arrive, not one worker after the other: each rank's first line
    # comes before the other rank's last.
    assert got.index("[rank 1] tick 0") < got.index("[rank 0] tick 9"), got
    assert got.index("[rank 0] tick 0") < got.index("[rank 1] tick 9"), got
    # It ended with the workers, not at a timeout.
    assert time.monotonic() - began < 45
    phase = wait_for_phase(release.cluster, namespace, "ticks", ("Succeeded", "Failed"), 30)
    assert phase["status"]["phase"] == "Succeeded"
