"""The test kubelet's log endpoint: what `kubectl logs` and `trainwave logs` read.

The API server serves `GET .../pods/{name}/log` by calling the pod's node at
`https://<InternalIP>:<daemonEndpoints.kubeletEndpoint.Port>/containerLogs/
{namespace}/{pod}/{container}`. The local API server has no
--kubelet-certificate-authority, so it does not verify the kubelet's serving
certificate and a self-signed one will do; it sends no client certificate
either, so nothing here authenticates the caller (the port is on loopback).

Of the kubelet's query parameters, `follow`, `tailLines` and `limitBytes` are
honoured; `previous` is refused the way the kubelet refuses it for a
container that never restarted (the test kubelet never restarts one).
"""

from __future__ import annotations

import logging
import ssl
import subprocess
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import BinaryIO
from urllib.parse import parse_qs, urlsplit

from e2e.podrun import PodRun

logger = logging.getLogger(__name__)

FOLLOW_POLL_SECONDS = 0.1
# Finds the pod run behind (namespace, pod name): the newest run of that name.
Lookup = Callable[[str, str], PodRun | None]


class LogServer:
    def __init__(self, host: str, workdir: Path, lookup: Lookup) -> None:
        self.lookup = lookup
        self._stopping = threading.Event()
        handler = type("Handler", (_Handler,), {"server_state": self})
        self._http = ThreadingHTTPServer((host, 0), handler)
        self._http.daemon_threads = True
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(*_self_signed(workdir, host))
        self._http.socket = context.wrap_socket(self._http.socket, server_side=True)
        self.port: int = self._http.server_address[1]
        self._thread = threading.Thread(
            target=self._http.serve_forever, name="kubelet-logs", daemon=True
        )

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()  # ends every follow, so shutdown does not wait on them
        self._http.shutdown()
        self._http.server_close()


class _Handler(BaseHTTPRequestHandler):
    server_state: LogServer

    def log_message(self, format: str, *args: object) -> None:
        logger.debug("log server: " + format, *args)

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        parts = url.path.strip("/").split("/")
        if len(parts) != 4 or parts[0] != "containerLogs":
            self._refuse(404, f"no such endpoint {url.path}")
            return
        namespace, pod, container = parts[1:]
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        run = self.server_state.lookup(namespace, pod)
        if run is None:
            self._refuse(404, f"pod {namespace}/{pod} is not on this kubelet")
            return
        if query.get("previous") == "true":
            message = f'previous terminated container "{container}" in pod "{pod}" not found'
            self._refuse(400, message)
            return
        path = run.log_path(container)
        if not path.exists():
            # The kubelet's words, which the API server passes on to the client.
            self._refuse(400, f'container "{container}" in pod "{pod}" is waiting to start')
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Connection", "close")
        self.end_headers()
        limit = int(query["limitBytes"]) if "limitBytes" in query else None
        with path.open("rb") as stream:
            data = _tail(stream.read(), query.get("tailLines"))
            sent = self._send(data, limit)
            if query.get("follow") == "true":
                self._follow(run, stream, sent, limit)

    def _refuse(self, code: int, message: str) -> None:
        # Plain text, as the kubelet answers: the API server hands the body to the client.
        body = message.encode()
        self.send_response(code)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _follow(self, run: PodRun, stream: BinaryIO, sent: int, limit: int | None) -> None:
        """Send what the container appends until its pod's processes are gone."""
        while not self.server_state.stopping and (limit is None or sent < limit):
            done = run.finished.is_set()  # read once more after the end: the last lines
            sent += self._send(stream.read(), None if limit is None else limit - sent)
            if done:
                return
            run.finished.wait(FOLLOW_POLL_SECONDS)

    def _send(self, data: bytes, limit: int | None) -> int:
        if limit is not None:
            data = data[:limit]
        if data:
            self.wfile.write(data)
            self.wfile.flush()
        return len(data)


def _tail(data: bytes, lines: str | None) -> bytes:
    if lines is None:
        return data
    count = int(lines)
    if count <= 0:
        return b""
    kept = data.splitlines(keepends=True)[-count:]
    return b"".join(kept)


def _self_signed(workdir: Path, host: str) -> tuple[str, str]:
    """A serving certificate for `host`; ECDSA P-256 like tests/cluster/pki.py, for speed."""
    cert, key = workdir / "kubelet-serving.crt", workdir / "kubelet-serving.key"
    command = [
        "openssl", "req", "-x509", "-nodes", "-days", "30",
        "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
        "-keyout", str(key), "-out", str(cert), "-subj", "/CN=test-kubelet",
        "-addext", f"subjectAltName=IP:{host}",
    ]  # fmt: skip
    subprocess.run(command, capture_output=True, check=True)
    return str(cert), str(key)
