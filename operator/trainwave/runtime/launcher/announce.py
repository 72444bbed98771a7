"""The store host tells the other workers its address, so they rejoin without cluster DNS.

When worker 0 is replaced alone, the other workers' launchers start their agents again
to meet the new worker 0's rendezvous store (rejoin.py). Found by the endpoint's name,
the store was reached 30.3 s late on three real nodes: the kept worker's first lookup,
7 s after the drain, got an answer that CoreDNS then served for its cache TTL (`cache
30`, `ttl 30`, as kubeadm sets them), while the new worker 0 was up already. No lookup
made before the new pod's address is published can be trusted, and a launcher cannot
know when that is. The new worker 0 can:

- its launcher, when it hosts the store and replaces worker 0 alone (the operator sets
  TRAINWAVE_REPLACEMENT on such a pod), POSTs contract.STORE_PATH to every other
  worker's status port (their names have not changed, so DNS answers them rightly),
  trying each again every second for ANNOUNCE_WAIT_SECONDS: a JSON body naming the
  rendezvous, its own pod IP and the time, signed with the job's key (signatures.py,
  purpose `store`) as worker 0 of the job's attempt;
- a launcher keeps the newest announcement that verifies, with the sender's address as
  its socket saw it (pods reach each other without NAT in Kubernetes' network model),
  and when it rejoins it tries that address at the endpoint's port first
  (rejoin.wait_for_store); it resolves the name only after ANNOUNCE_WAIT_SECONDS without
  an announced address that answers (an older worker 0, or a policy that blocks the
  status port between workers).

A worker without the job's key neither sends nor accepts announcements (its launcher
logs `status-unsigned`) and rejoins by the name, as before.

Replays. The signed body names the sender's pod IP (TRAINWAVE_POD_IP, which the sender
also binds its connection to) and the wall-clock time it was sent. A receiver refuses a
body whose address is not the connection's source, so a captured announcement replayed
from any other address names nothing; and one sent more than MAX_AGE_SECONDS ago or
ahead (by the receiver's clock), so a replay from worker 0's old address, should another
pod get that IP later, is refused too. Within that window a replay from the same
address says what the original said. Nonces are therefore not remembered.
"""

from __future__ import annotations

import http.client
import ipaddress
import json
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from trainwave import contract, signatures

# How long a rejoining launcher waits for an announced address before it also resolves
# the endpoint's name: a new pod's start, scheduling to a running launcher, on a node
# that has the image.
ANNOUNCE_WAIT_SECONDS = 30.0
# An announcement is a few dozen bytes; anything much larger is not one.
MAX_BODY_BYTES = 4096
SEND_TIMEOUT_SECONDS = 2.0
# A peer that cannot be reached is tried again each second for as long as the others wait
# for an announcement: a new pod's own DNS lookups failed for its first 2 s on a real node
# ("Temporary failure in name resolution").
SEND_TRIES = int(ANNOUNCE_WAIT_SECONDS)
SEND_PARALLEL = 16
# How far the time an announcement says it was sent may be from the receiver's clock: the
# sender's tries last ANNOUNCE_WAIT_SECONDS, and nodes' clocks (NTP) agree within seconds.
MAX_AGE_SECONDS = 2 * ANNOUNCE_WAIT_SECONDS


@dataclass(frozen=True)
class Heard:
    address: str  # the store host's address, as the announcement's connection came from
    received: float  # time.monotonic() when it arrived


class Announcements:
    """The newest verified announcement this launcher received (thread-safe: the status
    server's handler threads write, the supervise loop reads)."""

    def __init__(
        self,
        key: bytes | None,
        identity: signatures.Identity,
        rendezvous_id: str,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._key = key
        self._host = signatures.Identity(identity.namespace, identity.job, identity.attempt, 0)
        self._rendezvous_id = rendezvous_id
        self._clock = clock
        self._wall = wall
        self._lock = threading.Lock()
        self._newest: Heard | None = None

    @property
    def accepting(self) -> bool:
        return self._key is not None

    def newest(self) -> Heard | None:
        with self._lock:
            return self._newest

    def receive(
        self, body: bytes, nonce: str, signature: str, sender: str
    ) -> tuple[int, dict[str, Any]]:
        """HTTP code and answer for one POST; a verified one becomes the newest."""
        if self._key is None:
            return 403, {"error": "this worker has no job key; it rejoins by name"}
        if len(body) > MAX_BODY_BYTES or not signatures.valid_nonce(nonce):
            return 400, {"error": f"expected a signed body under {MAX_BODY_BYTES} bytes"}
        if not signatures.verify(
            self._key, self._host, nonce, body, signature, purpose=signatures.STORE
        ):
            return 403, {"error": "signature does not verify as this job's worker 0"}
        try:
            document = json.loads(body)
        except ValueError:
            return 400, {"error": "body is not JSON"}
        if not isinstance(document, dict):
            return 400, {"error": "body is not a JSON object"}
        named = document.get("rdzv_id")
        if named != self._rendezvous_id:
            return 409, {"error": f"rdzv_id {named!r} is not this worker's rendezvous"}
        address = document.get("address")
        if not isinstance(address, str) or _ip(address) is None or _ip(address) != _ip(sender):
            return 409, {"error": f"address {address!r} is not where it came from ({sender})"}
        sent_at = document.get("sent_at")
        if not isinstance(sent_at, int | float) or isinstance(sent_at, bool):
            return 400, {"error": f"sent_at {sent_at!r} is not a number of seconds"}
        age = self._wall() - sent_at
        if abs(age) > MAX_AGE_SECONDS:
            return 409, {
                "error": f"sent_at is {age:.0f}s from this worker's clock; "
                f"accepted within {MAX_AGE_SECONDS:.0f}s"
            }
        heard = Heard(address=sender, received=self._clock())
        with self._lock:
            self._newest = heard
        return 200, {"address": sender}


def body(rendezvous_id: str, address: str, sent_at: float) -> bytes:
    document = {"rdzv_id": rendezvous_id, "address": address, "sent_at": sent_at}
    return json.dumps(document, sort_keys=True).encode()


def announce(
    peers: Sequence[str],
    status_port: int,
    rendezvous_id: str,
    key: bytes,
    me: signatures.Identity,
    *,
    address: str,
    tries: int = SEND_TRIES,
    pause: float = 1.0,
) -> dict[str, str]:
    """POST the announcement to each peer from `address` (this pod's IP, which the body
    names); peer -> "ok" or why not (the last try's error; an HTTP refusal is not tried
    again)."""

    def one(peer: str) -> str:
        why = "not tried"
        for attempt in range(tries):
            if attempt:
                time.sleep(pause)
            payload = body(rendezvous_id, address, time.time())
            nonce = signatures.new_nonce()
            headers = {
                "Content-Type": "application/json",
                contract.STATUS_NONCE_HEADER: nonce,
                contract.STATUS_SIGNATURE_HEADER: signatures.sign(
                    key, me, nonce, payload, purpose=signatures.STORE
                ),
            }
            # From this address, whatever route the kernel would pick (a host-network pod
            # on a node with several interfaces): the receiver checks the body against it.
            connection = http.client.HTTPConnection(
                peer, status_port, timeout=SEND_TIMEOUT_SECONDS, source_address=(address, 0)
            )
            try:
                connection.request("POST", contract.STORE_PATH, body=payload, headers=headers)
                answer = connection.getresponse()
                answer.read()
                if answer.status == 200:
                    return "ok"
                return f"refused: HTTP {answer.status}"  # it answered: trying again won't help
            except (OSError, http.client.HTTPException) as error:
                why = str(error) or type(error).__name__
            finally:
                connection.close()
        return why

    if not peers:
        return {}
    with ThreadPoolExecutor(min(SEND_PARALLEL, len(peers))) as pool:
        return dict(zip(peers, pool.map(one, peers), strict=True))


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """An address as one form: a dual-stack socket shows an IPv4 peer as ::ffff:a.b.c.d."""
    try:
        ip = ipaddress.ip_address(text.strip("[]"))
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip
