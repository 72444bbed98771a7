"""A small HTTPS client for the local API server, on the standard library only.

The harness needs a handful of calls (readiness, list/create/delete nodes) and
must answer `up` on a running cluster in well under a second; importing the
full `kubernetes` client would cost more than the calls themselves. Tests use
kubectl or the real client; this is plumbing for the harness alone.
"""

from __future__ import annotations

import http.client
import json
import ssl
import threading
from typing import Any
from urllib.parse import urlsplit

from cluster.pki import Pki


class ApiError(RuntimeError):
    def __init__(self, status: int, method: str, path: str, detail: str) -> None:
        super().__init__(f"{method} {path}: HTTP {status}: {detail}")
        self.status = status


class ApiClient:
    """Authenticates as the admin client certificate; safe to share between threads."""

    def __init__(self, server: str, pki: Pki, timeout: float = 30.0) -> None:
        url = urlsplit(server)
        if url.scheme != "https" or url.hostname is None or url.port is None:
            raise ValueError(f"server must look like https://127.0.0.1:6443, got {server!r}")
        self.server = server
        self._host = url.hostname
        self._port = url.port
        self._timeout = timeout
        self._context = ssl.create_default_context(cafile=str(pki.ca_cert))
        self._context.load_cert_chain(str(pki.admin_cert), str(pki.admin_key))
        # One keep-alive connection per thread: http.client connections are not
        # thread-safe, and reconnecting per request would double the TLS work.
        self._local = threading.local()

    def request(
        self, method: str, path: str, body: Any = None, content_type: str = "", accept: str = ""
    ) -> Any:
        """Send one request; returns the decoded JSON body, raises ApiError on non-2xx.
        `accept` replaces plain JSON, e.g. to ask for a PartialObjectMetadataList."""
        payload = None if body is None else json.dumps(body).encode()
        headers = {"Accept": accept or "application/json"}
        if payload is not None:
            headers["Content-Type"] = content_type or "application/json"
        for attempt in (1, 2):
            connection = self._connection()
            try:
                connection.request(method, path, body=payload, headers=headers)
                response = connection.getresponse()
                data = response.read()
            except (http.client.HTTPException, OSError):
                # A kept-alive connection the server closed: retry once, fresh.
                self._drop_connection()
                if attempt == 2:
                    raise
                continue
            if response.status >= 300:
                raise ApiError(response.status, method, path, _detail(data))
            return json.loads(data) if data else None
        raise AssertionError("unreachable")

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def get_text(self, path: str) -> tuple[int, str]:
        """GET that returns (status, body text) instead of raising: for health endpoints."""
        connection = self._connection()
        try:
            connection.request("GET", path)
            response = connection.getresponse()
            return response.status, response.read().decode(errors="replace")
        except (http.client.HTTPException, OSError):
            self._drop_connection()
            raise

    def close(self) -> None:
        self._drop_connection()

    def _connection(self) -> http.client.HTTPSConnection:
        connection = getattr(self._local, "connection", None)
        if connection is None:
            connection = http.client.HTTPSConnection(
                self._host, self._port, context=self._context, timeout=self._timeout
            )
            self._local.connection = connection
        return connection

    def _drop_connection(self) -> None:
        connection = getattr(self._local, "connection", None)
        if connection is not None:
            connection.close()
            self._local.connection = None


def _detail(data: bytes) -> str:
    try:
        return str(json.loads(data).get("message", data[:300]))
    except (ValueError, AttributeError):
        return data[:300].decode(errors="replace")
