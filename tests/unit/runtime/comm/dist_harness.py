"""Run a function on N gloo ranks in separate processes on 127.0.0.1, collect what each returns.

Ranks are forked from a forkserver that imported torch once (a fresh import per
rank costs seconds on 2 busy cores; forking the test process itself could hang
in OpenMP). Each rank computes on one thread, so N ranks stay predictable. A rank that raises sends its traceback back and
the harness raises it in the test; a rank that hangs is killed at the timeout.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import queue
import socket
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
    try:
        for _ in range(world):
            rank, ok, value = out.get(timeout=timeout)
            if not ok:
                raise AssertionError(f"rank {rank} failed:\n{value}")
            results[rank] = pickle.loads(value)
    except queue.Empty:
        raise AssertionError(
            f"ranks {sorted(set(range(world)) - set(results))} gave no result in {timeout} s"
        ) from None
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join()
    return [results[r] for r in range(world)]
