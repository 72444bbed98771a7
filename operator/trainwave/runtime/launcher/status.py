"""GET contract.STATUS_PATH on the status port: the launcher's view of this worker, as JSON.

Served by the launcher, not the training process, so it answers while the
training process is still importing, stuck, or restarting, and it dies with
the pod rather than with a rank. When the job's status key is mounted, each
answer to a request that carries the operator's nonce is signed
(trainwave/signatures.py); without a nonce (a person with curl) it is not.

POST paths are given by the launcher (contract.STORE_PATH: launcher/announce.py); each
handler gets the body, the nonce and signature headers and the sender's address.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from trainwave import contract, signatures

# serve_forever notices stop() at its next poll: 0.1 s rather than the default 0.5 s
# keeps a finishing worker's exit (and each test's teardown) short, for ten wake-ups
# a second of an otherwise idle thread.
STOP_POLL_SECONDS = 0.1

# (nonce, body) -> the signature header's value.
Signer = Callable[[str, bytes], str]
# (body, nonce, signature, sender's address) -> HTTP code and answer.
PostHandler = Callable[[bytes, str, str, str], tuple[int, dict[str, Any]]]
# Bodies we read at most; a POST's handler judges what it got.
MAX_POST_BYTES = 65536


class StatusServer:
    def __init__(
        self,
        host: str,
        port: int,
        provider: Callable[[], dict[str, Any]],
        signer: Signer | None = None,
        posts: Mapping[str, PostHandler] | None = None,
    ) -> None:
        handler = _handler(provider, signer, dict(posts or {}))
        self._server = ThreadingHTTPServer((host, port), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": STOP_POLL_SECONDS},
            name="trainwave-status",
            daemon=True,
        )

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> StatusServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _handler(
    provider: Callable[[], dict[str, Any]], signer: Signer | None, posts: dict[str, PostHandler]
) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?", 1)[0] != contract.STATUS_PATH:
                self._send(404, {"error": f"not found; try {contract.STATUS_PATH}"})
                return
            try:
                self._send(200, provider())
            except Exception as error:  # a broken report must not take the server down
                self._send(500, {"error": repr(error)})

        def do_POST(self) -> None:
            handle = posts.get(self.path.split("?", 1)[0])
            if handle is None:
                self._send(404, {"error": f"not found; POST only {sorted(posts)}"})
                return
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                length = -1
            if not 0 <= length <= MAX_POST_BYTES:
                self._send(400, {"error": f"Content-Length must be 0-{MAX_POST_BYTES}"})
                return
            body = self.rfile.read(length)
            headers = self.headers
            nonce = headers.get(contract.STATUS_NONCE_HEADER, "")
            signature = headers.get(contract.STATUS_SIGNATURE_HEADER, "")
            try:
                self._send(*handle(body, nonce, signature, self.client_address[0]))
            except Exception as error:  # a bad request must not take the server down
                self._send(500, {"error": repr(error)})

        def _send(self, code: int, document: dict[str, Any]) -> None:
            body = json.dumps(document, default=str).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            nonce = self.headers.get(contract.STATUS_NONCE_HEADER, "")
            if signer is not None and signatures.valid_nonce(nonce):
                self.send_header(contract.STATUS_SIGNATURE_HEADER, signer(nonce, body))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # one line per probe would drown the training log

    return Handler
