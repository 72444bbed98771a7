"""The node-local arbiter: turns on one GPU's memory, reclaimed from a dead job."""

import asyncio
import json
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from arbiter_job import run_job
from submodel_training import deterministic, make_case, plan, train_plain

from trainwave import contract
from trainwave.runtime.submodel.arbiter import Arbiter, ArbiterClient

HERE = Path(__file__).parent
OPERATOR = HERE.parents[3] / "operator"


def run(coroutine):
    return asyncio.run(coroutine)


def test_grants_first_come_first_served_within_capacity():
    async def scenario():
        arbiter = Arbiter(capacity=100)
        a = arbiter.request("a", 60)
        b = arbiter.request("b", 50)  # does not fit next to a
        c = arbiter.request("c", 10)  # would fit, but waits behind b: no starvation
        await asyncio.sleep(0)
        granted = [f.done() for f in (a, b, c)]
        arbiter.release("a")
        await asyncio.sleep(0)
        return granted, [f.done() for f in (a, b, c)], arbiter.status()

    before, after, status = run(scenario())
    assert before == [True, False, False]
    assert after == [True, True, True]
    assert status["used"] == 60
    assert status["holders"] == {"b": 50, "c": 10}


def test_forget_reclaims_a_holder_and_a_queued_request():
    async def scenario():
        arbiter = Arbiter(capacity=100)
        arbiter.request("dead", 80)
        queued = arbiter.request("alive", 70)
        arbiter.request("dead-too", 90)
        arbiter.forget("dead-too")
        arbiter.forget("dead")
        await asyncio.sleep(0)
        return queued.done(), arbiter.status()

    granted, status = run(scenario())
    assert granted
    assert status["holders"] == {"alive": 70}
    assert status["waiting"] == []
    assert status["reclaimed"] == 1


def test_request_larger_than_capacity_is_refused_with_the_numbers():
    async def scenario():
        Arbiter(capacity=100).request("big", 101)

    with pytest.raises(
        ValueError, match=r"bytes: got 101; expected at most the GPU's shared capacity 100"
    ):
        run(scenario())


def start_server(socket_path: Path, capacity: int) -> subprocess.Popen:
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trainwave.runtime.submodel.arbiter",
            "--socket",
            str(socket_path),
            "--capacity",
            str(capacity),
        ],
        env={**os.environ, "PYTHONPATH": str(OPERATOR)},
        stderr=subprocess.PIPE,
        text=True,
    )
    # Until it accepts a connection: the socket file appears at bind(), before listen(), and
    # a connect in between is refused (seen once in CI under load).
    deadline = time.monotonic() + 10
    while not _accepts(socket_path):
        assert server.poll() is None, server.stderr.read()
        assert time.monotonic() < deadline, "arbiter did not start"
        time.sleep(0.05)
    return server


def _accepts(socket_path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(socket_path))
        except (FileNotFoundError, ConnectionRefusedError):
            return False
    return True


def test_a_job_gone_while_queued_is_never_granted(tmp_path):
    socket_path = tmp_path / "arbiter.sock"
    server = start_server(socket_path, capacity=100)
    try:
        holder = ArbiterClient(str(socket_path), job="holder")
        holder.acquire(100)
        queued = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        queued.connect(str(socket_path))
        queued.sendall(b'{"job": "queued", "op": "acquire", "bytes": 50}\n')
        observer = ArbiterClient(str(socket_path), job="observer")
        deadline = time.monotonic() + 10
        while observer.status()["waiting"] != ["queued"]:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        queued.close()  # dies while waiting
        while observer.status()["waiting"]:
            assert time.monotonic() < deadline, "the dead job's request stayed queued"
            time.sleep(0.02)
        holder.release()
        status = observer.status()
        holder.close()
        observer.close()
    finally:
        server.kill()
        server.wait()
    assert status["holders"] == {}
    assert status["used"] == 0


def test_sigkilled_job_leaves_the_other_two_running_to_completion(tmp_path, monkeypatch):
    """Three jobs, three processes, one arbiter. The capacity holds one group
    of the largest size and a little more, so the jobs take turns; one job is
    SIGKILLed while it holds its grant and another waits for it, and the
    others must still finish, with the losses of training alone."""
    with deterministic():
        model, batches = make_case("mlp", steps=3)
        expected = train_plain(model, batches, "adamw").losses
        part = plan(model, batches, "adamw", groups=3)
    peaks = [g.peak for g in part.groups]
    socket_path = tmp_path / "arbiter.sock"
    capacity = max(peaks) + min(peaks) // 2  # no two groups fit together: jobs take turns
    server = start_server(socket_path, capacity)
    results = [tmp_path / f"job{i}.json" for i in range(3)]
    monkeypatch.setenv(contract.ENV_ARBITER_SOCKET, str(socket_path))
    # job1 stalls on its first grant, so sooner or later the others queue behind it.
    fork = multiprocessing.get_context("fork")
    jobs = [fork.Process(target=run_job, args=(part, r, r == results[1])) for r in results]
    for process in jobs:
        process.start()
    victim, others = jobs[1], [jobs[0], jobs[2]]
    holding = results[1].with_suffix(".holding")
    try:
        client = ArbiterClient(str(socket_path), job="observer")
        deadline = time.monotonic() + 45
        while not (holding.exists() and client.status()["waiting"]):
            assert victim.is_alive()
            assert time.monotonic() < deadline, f"no contention: {client.status()}"
            time.sleep(0.05)
        before = client.status()
        os.kill(victim.pid, signal.SIGKILL)
        victim.join()
        for process in others:
            process.join(timeout=45)
        codes = [p.exitcode for p in others]
        after = client.status()
        client.close()
    finally:
        for process in jobs:
            if process.is_alive():
                process.kill()
                process.join()
        server.kill()
        server.wait()
    assert before["holders"] == {"job1": int(holding.read_text())}
    assert before["waiting"]  # someone was blocked on the victim's memory
    assert codes == [0, 0]
    assert after["reclaimed"] == 1
    assert after["used"] == 0
    for result in (results[0], results[2]):
        assert json.loads(result.read_text())["losses"] == expected
    assert victim.exitcode == -signal.SIGKILL
    assert not results[1].exists()
