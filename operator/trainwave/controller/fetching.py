"""One bounded HTTP GET of a worker's /status: a total deadline, a byte cap, no redirects.

Workers are tenants' code, so the server at the other end may be slow on
purpose (a byte every second, forever), huge, or point elsewhere with a
redirect (to an address the `networks` check never saw). urllib follows
redirects and its timeout bounds each socket read, not the request; the header
parser of http.client reads line by line, so a slow server can keep it busy
far past any per-read timeout. So the response is read raw from the socket,
each read's timeout set to what is left of ONE deadline, stopping at a byte
cap, and only then parsed, from memory, by http.client. Only a 200 counts;
a 3xx is an answer like any other error, never followed.
"""

import http.client
import io
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass

READ_CHUNK = 65536


class FetchError(Exception):
    """Why a status read gave nothing; `outcome` is its metric label."""

    def __init__(self, outcome: str, message: str):
        super().__init__(message)
        self.outcome = outcome


@dataclass(frozen=True)
class Fetched:
    body: bytes
    headers: Mapping[str, str]  # lower-case names


def fetch(
    address: str,
    port: int,
    path: str,
    headers: Mapping[str, str],
    *,
    deadline: float,
    max_bytes: int,
) -> Fetched:
    """GET http://address:port/path within `deadline` seconds in total, reading at
    most `max_bytes` of response (status line, headers and body together)."""
    ends = time.monotonic() + deadline
    host = f"[{address}]" if ":" in address else address
    lines = [f"GET {path} HTTP/1.0", f"Host: {host}:{port}", "Connection: close"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    request = ("\r\n".join(lines) + "\r\n\r\n").encode("ascii")
    raw = bytearray()
    try:
        with socket.create_connection((address, port), timeout=_left(ends)) as sock:
            sock.settimeout(_left(ends))
            sock.sendall(request)
            while True:
                sock.settimeout(_left(ends))
                chunk = sock.recv(READ_CHUNK)
                if not chunk:
                    break
                raw += chunk
                if len(raw) > max_bytes:
                    raise FetchError(
                        "too_large", f"response larger than {max_bytes} bytes; cut off"
                    )
    except TimeoutError:
        raise FetchError("slow", f"no complete response within {deadline:g} s") from None
    except OSError as error:
        raise FetchError("unreachable", f"unreachable: {error}") from None
    return _parse(bytes(raw))


def _left(ends: float) -> float:
    left = ends - time.monotonic()
    if left <= 0:
        raise TimeoutError
    return left


def _parse(raw: bytes) -> Fetched:
    response = http.client.HTTPResponse(_Replay(raw))  # type: ignore[arg-type]
    try:
        response.begin()
        body = response.read()
    except (http.client.HTTPException, ValueError) as error:
        raise FetchError("malformed", f"not an HTTP response: {error!r}") from None
    if response.status != 200:
        where = response.getheader("Location")
        raise FetchError(
            "http_error",
            f"HTTP {response.status}" + (f" (redirect to {where!r} not followed)" if where else ""),
        )
    return Fetched(body, {k.lower(): v for k, v in response.getheaders()})


class _Replay:
    """The little of a socket that http.client.HTTPResponse uses: makefile()."""

    def __init__(self, raw: bytes) -> None:
        self._raw = raw

    def makefile(self, *_: object, **__: object) -> io.BytesIO:
        return io.BytesIO(self._raw)
