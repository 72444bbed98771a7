"""Node-local arbiter: jobs sharing one GPU take turns on its memory.

Stdlib only, so the server starts in milliseconds and needs no torch. One
server per shared GPU listens on a unix socket (path from
TRAINWAVE_ARBITER_SOCKET); each job is its own process with one connection.

Protocol: one JSON object per line. A job sends {"op": "acquire", "bytes": n}
and the reply {"granted": n} comes when n bytes fit next to the grants already
held; requests are served first come, first served, so a large request is not
starved by a stream of small ones. {"op": "release"} returns the job's grant
({"released": n}). {"op": "status"} replies with capacity, used and holders.
A job holds at most one grant (the executor keeps one group resident).

In the agent's DaemonSet the arbiter serves a directory (`--directory`): the
agent writes the node's shared GPUs and their bytes into `gpus.json` there,
and the arbiter serves one socket per GPU, `<uuid>.sock`, which the operator
mounts into the shared workers placed on that GPU.

When a job's connection closes for any reason (exit, crash, SIGKILL: the
kernel closes its sockets), its grant and its place in the queue are reclaimed
at once and the next waiting job is granted, so the others continue.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import sys
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainwave import contract

log = logging.getLogger("trainwave.arbiter")


@dataclass
class Waiter:
    job: str
    nbytes: int
    granted: asyncio.Future[None]


@dataclass
class Arbiter:
    capacity: int
    held: dict[str, int] = field(default_factory=dict)
    queue: deque[Waiter] = field(default_factory=deque)
    reclaimed: int = 0

    @property
    def used(self) -> int:
        return sum(self.held.values())

    def request(self, job: str, nbytes: int) -> asyncio.Future[None]:
        if nbytes > self.capacity:
            raise ValueError(
                f"bytes: got {nbytes}; expected at most the GPU's shared capacity {self.capacity}"
            )
        if job in self.held:
            raise ValueError(f"job {job} already holds {self.held[job]} B; release first")
        waiter = Waiter(job, nbytes, asyncio.get_running_loop().create_future())
        self.queue.append(waiter)
        self.grant()
        return waiter.granted

    def release(self, job: str) -> int:
        freed = self.held.pop(job, 0)
        self.grant()
        return freed

    def forget(self, job: str) -> int:
        """The job is gone: drop its grant and its queued request."""
        self.queue = deque(w for w in self.queue if w.job != job)
        freed = self.release(job)
        if freed:
            self.reclaimed += 1
            log.warning("reclaimed %d B from %s (connection closed while holding)", freed, job)
        return freed

    def grant(self) -> None:
        while self.queue and self.used + self.queue[0].nbytes <= self.capacity:
            waiter = self.queue.popleft()
            if waiter.granted.done():  # cancelled by a disconnect
                continue
            self.held[waiter.job] = waiter.nbytes
            waiter.granted.set_result(None)

    def status(self) -> dict[str, object]:
        return {
            "capacity": self.capacity,
            "used": self.used,
            "holders": dict(self.held),
            "waiting": [w.job for w in self.queue],
            "reclaimed": self.reclaimed,
        }


async def serve_connection(
    arbiter: Arbiter, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    job = f"conn-{id(writer):x}"
    try:
        while line := await reader.readline():
            message = json.loads(line)
            job = str(message.get("job", job))
            op = message.get("op")
            reply: dict[str, object]
            try:
                if op == "acquire":
                    granted = arbiter.request(job, int(message["bytes"]))
                    if not await granted_unless_gone(granted, reader):
                        break  # gone while queued: `finally` drops its request
                    reply = {"granted": arbiter.held[job]}
                elif op == "release":
                    reply = {"released": arbiter.release(job)}
                elif op == "status":
                    reply = arbiter.status()
                else:
                    reply = {"error": f"op: got {op!r}; expected acquire, release or status"}
            except ValueError as invalid:
                reply = {"error": str(invalid)}
            writer.write(json.dumps(reply).encode() + b"\n")
            await writer.drain()
    except (ConnectionError, json.JSONDecodeError):
        pass
    finally:
        arbiter.forget(job)
        writer.close()


async def granted_unless_gone(granted: asyncio.Future[None], reader: asyncio.StreamReader) -> bool:
    """Wait for the grant, watching the connection: a job that dies while
    queued must not be granted memory it can never release. A waiting client
    sends nothing, so any read that completes means it hung up."""
    gone: asyncio.Future[Any] = asyncio.ensure_future(reader.read(1))
    waiting: set[asyncio.Future[Any]] = {granted, gone}
    await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
    if not granted.done():
        return False
    gone.cancel()
    # The reader takes one waiter at a time: let the cancelled read finish
    # before the connection's next readline.
    with contextlib.suppress(asyncio.CancelledError):
        await gone
    return True


async def serve(path: str, capacity: int, ready: asyncio.Event | None = None) -> None:
    arbiter = Arbiter(capacity)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await serve_connection(arbiter, reader, writer)

    server = await asyncio.start_unix_server(handle, path=path)
    # Workers run as any user; connecting to a unix socket needs write permission on
    # it. Who can reach the directory is the boundary: only shared workers mount it.
    os.chmod(path, 0o666)
    log.info("arbiter on %s, capacity %d B", path, capacity)
    if ready is not None:
        ready.set()
    async with server:
        await server.serve_forever()


def read_gpus(directory: Path) -> dict[str, int]:
    """The agent's gpus.json: {uuid: bytes}; {} while it has not written one yet."""
    path = directory / contract.ARBITER_GPUS_FILE
    try:
        found = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    if not isinstance(found, dict) or not all(
        isinstance(k, str) and isinstance(v, int) and v > 0 for k, v in found.items()
    ):
        raise ValueError(f"{path}: got {found!r}; expected an object of GPU UUID -> bytes > 0")
    return found


async def serve_directory(directory: Path, poll_seconds: float = 5.0) -> None:
    """One server per GPU the agent lists, started as it lists them. A GPU whose
    capacity changes is served anew (its holders reconnect on their next group). A
    socket nobody serves is removed (a GPU no longer shared, or one an earlier arbiter
    served, e.g. before the node's sharing changed), so the host directory holds what
    gpus.json says and a worker pinned to a stale GPU fails at once."""
    running: dict[str, tuple[int, asyncio.Task[None]]] = {}
    while True:
        try:
            wanted = read_gpus(directory)
        except (ValueError, OSError) as invalid:
            log.error("%s", invalid)  # keep serving what runs; the agent rewrites the file
            wanted = {uuid: capacity for uuid, (capacity, _) in running.items()}
        for uuid, (capacity, task) in list(running.items()):
            if wanted.get(uuid) != capacity:
                task.cancel()
                del running[uuid]
        for uuid, capacity in wanted.items():
            if uuid not in running:
                socket_path = str(directory / f"{uuid}.sock")
                running[uuid] = (capacity, asyncio.create_task(serve(socket_path, capacity)))
        _remove_unserved_sockets(directory, set(running))
        await asyncio.sleep(poll_seconds)


def _remove_unserved_sockets(directory: Path, served: set[str]) -> None:
    for path in directory.glob("*.sock"):
        if path.stem not in served:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            log.info("removed %s: no shared GPU %s any more", path, path.stem)


class ArbiterClient:
    """A job's side: blocking acquire/release over one connection."""

    def __init__(self, path: str | None = None, job: str | None = None) -> None:
        path = path or os.environ.get(contract.ENV_ARBITER_SOCKET, "")
        if not path:
            raise ValueError(
                f"{contract.ENV_ARBITER_SOCKET}: not set; expected the arbiter's socket path"
            )
        self.job = job or f"pid-{os.getpid()}"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.stream = self.sock.makefile("rwb")

    def call(self, message: dict[str, object]) -> dict[str, object]:
        self.stream.write(json.dumps({"job": self.job, **message}).encode() + b"\n")
        self.stream.flush()
        reply: dict[str, object] = json.loads(self.stream.readline())
        if "error" in reply:
            raise ValueError(f"arbiter: {reply['error']}")
        return reply

    def acquire(self, nbytes: int) -> None:
        self.call({"op": "acquire", "bytes": nbytes})

    def release(self) -> None:
        self.call({"op": "release"})

    def status(self) -> dict[str, object]:
        return self.call({"op": "status"})

    def close(self) -> None:
        self.stream.close()
        self.sock.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="trainwave node-local GPU-memory arbiter")
    parser.add_argument("--socket", default=os.environ.get(contract.ENV_ARBITER_SOCKET, ""))
    parser.add_argument("--capacity", type=int, help="bytes of GPU memory to share")
    parser.add_argument(
        "--directory",
        type=Path,
        help=f"serve every GPU the agent lists in DIRECTORY/{contract.ARBITER_GPUS_FILE}, "
        "one socket each (<uuid>.sock)",
    )
    options = parser.parse_args(argv)
    if options.directory is None and not (options.socket and options.capacity):
        parser.error(
            f"give --directory, or --capacity with --socket or {contract.ENV_ARBITER_SOCKET}"
        )
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # In the agent pod's container the arbiter is PID 1, and the kernel gives PID 1 no
    # signal it has no handler for: the kubelet's SIGTERM was ignored, so every stop of
    # the pod (an upgrade, a drain) waited out its 30 s grace period for the SIGKILL.
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # raises KeyboardInterrupt
    with contextlib.suppress(KeyboardInterrupt):
        if options.directory is not None:
            asyncio.run(serve_directory(options.directory))
        else:
            asyncio.run(serve(options.socket, options.capacity))
    return 0


if __name__ == "__main__":
    sys.exit(main())
