"""`python -m trainwave.runtime.preflight`: the gang's bandwidth test, one process per rank.

The launcher runs this under torch.distributed.run with the gang's own PET_*
variables (runtime/launcher/preflight.py) before the user's command, so every
process of the gang takes part, over the backend the job will train with: NCCL
where CUDA is present (not verified here: no GPU), gloo on CPU.

Two measurements, bandwidths in Gbit/s (10^9 bits per second):
- `bus_gbps`: an all-reduce of `TRAINWAVE_PREFLIGHT_SIZE_MIB` over the whole gang,
  as nccl-tests defines its bus bandwidth (doc/PERFORMANCE.md): algbw = S / t and,
  for all-reduce, busbw = algbw x 2(n-1)/n, which makes the figure comparable to the
  links' speed whatever the number of ranks. Every rank waits for the slowest link
  of the ring, so this names a slow gang, not a slow node.
- `sendrecv_gbps`: each rank sends the same buffer to the rank with its local rank on
  the next worker and receives from the previous one; the time until ITS receive
  completes is its figure (nccl-tests' sendrecv: busbw = algbw). A slow link into one
  worker shows in that worker's ranks only. Needs two workers or more.
  All local ranks of a worker send at once (its link carries their streams, as in
  training), but a worker never sends and receives in the same phase (send_phase):
  TCP's acknowledgements for what a worker receives leave on the link its own stream
  fills, so over one slowed link the receive the other way slowed to the same figure
  (0.096 Gbit/s on both workers behind a 0.2 Gbit/s token bucket, 2 runs of 4,
  tests/e2e/test_preflight_link.py) and neither worker could be named.

Each rank writes its figures to `<report dir>/preflight-rank-<rank>.json` for its
launcher, which serves them in /status for the operator to judge.
"""

from __future__ import annotations

import functools
import os
import statistics
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from trainwave import contract
from trainwave.runtime import jsonlog
from trainwave.runtime.reports import write_json_atomic

RANK_FILE = "preflight-rank-{rank}.json"
RANK_GLOB = "preflight-rank-*.json"
ITERATIONS = 3  # timed iterations after one warm-up; the median is reported
BITS = 8


def allreduce_bus_gbps(size_bytes: int, seconds: float, world: int) -> float:
    """nccl-tests' busbw for all-reduce, in Gbit/s: algbw x 2(n-1)/n."""
    if seconds <= 0 or world < 1:
        return 0.0
    algbw = size_bytes * BITS / seconds / 1e9
    return algbw * 2 * (world - 1) / world if world > 1 else algbw


def sendrecv_gbps(size_bytes: int, seconds: float) -> float:
    """nccl-tests' busbw for sendrecv (factor 1), in Gbit/s."""
    return size_bytes * BITS / seconds / 1e9 if seconds > 0 else 0.0


def ring_peers(rank: int, world: int, local_world: int) -> tuple[int, int] | None:
    """(send to, receive from): the same local rank on the next and the previous worker;
    None with a single worker (no link between workers to measure)."""
    if local_world < 1 or world <= local_world or world % local_world:
        return None
    return (rank + local_world) % world, (rank - local_world) % world


def send_phase(worker: int, workers: int) -> int:
    """The phase in which `worker` sends to the next worker: even workers in phase 0, odd
    ones in phase 1 and, in an odd ring of three or more, the last one alone in phase 2,
    so that no worker sends and receives in the same phase (a 2- or 3-colouring of the
    ring's links)."""
    if workers % 2 and workers > 1 and worker == workers - 1:
        return 2
    return worker % 2


def phases(workers: int) -> int:
    return 3 if workers % 2 and workers > 1 else 2


def measure(size_mib: int, timeout_seconds: float) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    local_rank = int(os.environ.get(contract.ENV_LOCAL_RANK, "0"))
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(seconds=timeout_seconds))
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        size = size_mib * 1024 * 1024
        buffer = torch.ones(size // 4, dtype=torch.float32, device=device)

        def sync() -> None:
            if cuda:
                torch.cuda.synchronize(device)

        def timed(run: Callable[[], object]) -> float:
            dist.barrier()
            sync()
            start = time.perf_counter()
            run()
            sync()
            return time.perf_counter() - start

        timed(lambda: dist.all_reduce(buffer))  # warm-up: connections, allocator
        seconds = statistics.median(
            timed(lambda: dist.all_reduce(buffer)) for _ in range(ITERATIONS)
        )
        result: dict[str, Any] = {
            "rank": rank,
            "world_size": world,
            "backend": "nccl" if cuda else "gloo",
            "size_mib": size_mib,
            "bus_gbps": round(allreduce_bus_gbps(size, seconds, world), 3),
        }
        local_world = int(os.environ.get(contract.ENV_LOCAL_WORLD_SIZE, "1"))
        peers = ring_peers(rank, world, local_world)
        if peers is not None:
            received = _ring_shift(
                buffer,
                peers=peers,
                worker=rank // local_world,
                workers=world // local_world,
                timed=timed,
                sync=sync,
            )
            result["sendrecv_gbps"] = round(sendrecv_gbps(size, received), 3)
            result["sendrecv_from"] = peers[1]
        dist.barrier()
        return result
    finally:
        dist.destroy_process_group()


def _ring_shift(
    buffer: Any,
    *,
    peers: tuple[int, int],
    worker: int,
    workers: int,
    timed: Callable[[Callable[[], object]], float],
    sync: Callable[[], None],
) -> float:
    """Median seconds until this rank's receive from `peers[1]` completed; it sends to
    `peers[0]` in its worker's own phase (after one warm-up round of every phase)."""
    import torch
    import torch.distributed as dist

    inbox = torch.empty_like(buffer)
    sends_in = send_phase(worker, workers)
    receives_in = send_phase((worker - 1) % workers, workers)
    received: list[float] = []

    def shift(phase: int) -> None:
        if phase == sends_in:
            dist.send(buffer, peers[0])
        elif phase == receives_in:
            start = time.perf_counter()
            dist.recv(inbox, peers[1])
            sync()
            received.append(time.perf_counter() - start)

    for round_ in range(1 + ITERATIONS):
        if round_ == 1:
            received.clear()  # the first round warmed up
        for phase in range(phases(workers)):
            timed(functools.partial(shift, phase))
    return statistics.median(received)


def main() -> int:
    started = time.time()
    size_mib = int(os.environ.get(contract.ENV_PREFLIGHT_SIZE_MIB, "64"))
    timeout = float(os.environ.get(contract.ENV_PREFLIGHT_TIMEOUT_SECONDS, "120"))
    report_dir = Path(os.environ.get(contract.ENV_REPORT_DIR, "/tmp/trainwave"))
    result = measure(size_mib, timeout)
    result["seconds"] = round(time.time() - started, 3)
    report_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(report_dir / RANK_FILE.format(rank=result["rank"]), result)
    jsonlog.write_line({"logger": "trainwave.preflight", **result})
    return 0


if __name__ == "__main__":
    sys.exit(main())
