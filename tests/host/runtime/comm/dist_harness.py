"""Run a function on N gloo ranks in separate processes on 127.0.0.1, collect what each returns.

Ranks are forked from a forkserver that imported torch once (a fresh import per
rank costs seconds on 2 busy cores; forking the test process itself could hang
in OpenMP). Each rank computes on one thread, so N ranks stay predictable.
Ranks meet at a barrier after sending their results, so none tears the group
down under a peer. The harness hears every rank before it raises: each failed
rank's traceback, a crashed rank's exit code, a rank silent past the timeout.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import queue
import socket
import time
import traceback
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank_main(
    *,
    fn: Callable[..., Any],
    rank: int,
    world: int,
    port: int,
    out: Any,
    args: tuple,
    init: bool = True,
    env: Mapping[str, str] | None = None,
) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ.update(env or {})
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        if init:
            dist.init_process_group(
                "gloo",
                init_method=f"tcp://127.0.0.1:{port}",
                rank=rank,
                world_size=world,
                timeout=timedelta(seconds=30),
            )
        else:  # what torchrun would export; the code under test joins by itself
            os.environ.update(
                {
                    "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": str(port),
                    "RANK": str(rank),
                    "LOCAL_RANK": str(rank),
                    "WORLD_SIZE": str(world),
                }
            )
        # Plain pickle copies tensors into the bytes; the queue's own pickler would
        # share their memory with a process that is about to exit.
        out.put((rank, True, pickle.dumps(fn(rank, world, *args))))
        if dist.is_initialized():
            # Rank 0 hosts the group's store; torch's new_group does not wait for
            # peers (TORCH_DIST_INIT_BARRIER is off), so a rank 0 that tore its
            # group down now could reset a peer still connecting a subgroup.
            dist.barrier()
    except BaseException:
        out.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_world(
    fn: Callable[..., Any],
    world: int,
    *args: Any,
    timeout: float = 45.0,
    init: bool = True,
    env: Mapping[str, str] | None = None,
) -> list[Any]:
    """fn(rank, world, *args) on every rank; returns the results in rank order.

    `env` is added to every rank's environment. With `init=False` the ranks get
    torchrun's variables instead of a process group, for code that joins itself.
    """
    ctx = mp.get_context("forkserver")
    # The server imports torch once; every rank is a fork of it, not a fresh import.
    ctx.set_forkserver_preload(["torch", "torch.distributed"])
    out = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(
            target=_rank_main,
            kwargs={
                "fn": fn,
                "rank": r,
                "world": world,
                "port": port,
                "out": out,
                "args": args,
                "init": init,
                "env": dict(env or {}),
            },
        )
        for r in range(world)
    ]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    failures: dict[int, str] = {}
    try:
        # Every rank is heard before anything is raised: a rank whose peer died
        # reports only "connection reset"; the peer's own traceback is the cause.
        deadline = time.monotonic() + timeout
        while len(results) + len(failures) < world:
            unheard = set(range(world)) - set(results) - set(failures)
            # Read before the wait: a rank that had exited by then had flushed its
            # result already, so one still missing after it crashed (a native abort
            # leaves no traceback).
            gone = {r for r in unheard if procs[r].exitcode is not None}
            try:
                rank, ok, value = out.get(timeout=0.5)
            except queue.Empty:
                late = unheard - gone if time.monotonic() > deadline else set()
                failures.update(dict.fromkeys(gone, "exited without a result"))
                failures.update(dict.fromkeys(late, f"gave no result in {timeout} s"))
                continue
            if ok:
                results[rank] = pickle.loads(value)
            else:
                failures[rank] = value
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join()
    if failures:
        exits = ", ".join(f"rank {r} exit {p.exitcode}" for r, p in enumerate(procs))
        raise AssertionError(
            f"ranks {sorted(failures)} failed ({exits}):\n"
            + "\n".join(f"--- rank {r}:\n{failures[r]}" for r in sorted(failures))
        )
    return [results[r] for r in range(world)]
