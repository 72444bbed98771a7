"""Signed worker status reports: who may say what about which job. Pure; stdlib only.

The worker's launcher signs each /status answer with HMAC-SHA256 over the
identity the answer speaks for (namespace, job, attempt, node rank), the
operator's nonce for this request and the body. The operator verifies with
the identity it ASKED for, never the one the body claims, so a report that
reaches it from the wrong server (hostNetwork jobs share a node's IP, a pod IP
reused by another pod) fails unless that server holds this job's key.

Each job's key is derived from the operator's master key and the job's UID:
the operator recomputes it instead of reading the job's Secret back (it needs
no right to read Secrets in users' namespaces), and a job deleted and created
again under the same name gets a new key. This module travels into worker
images with the runtime (runtime/install.py), so it imports nothing of ours.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

VERSION = "v1"
KEY_BYTES = 32
# A nonce is hex, sent by the operator; the cap keeps a forged header from
# making the worker hash megabytes.
NONCE_MAX_CHARS = 64
# What a signature vouches for: a worker's /status answer, or a store host's announcement.
STATUS = "status"
STORE = "store"


@dataclass(frozen=True)
class Identity:
    """The worker a report speaks for: the pod the operator asked, by its rank."""

    namespace: str
    job: str
    attempt: int
    rank: int


def new_master_key() -> bytes:
    return secrets.token_bytes(KEY_BYTES)


def new_nonce() -> str:
    return secrets.token_hex(16)


def job_key(master: bytes, namespace: str, job: str, uid: str) -> bytes:
    return hmac.new(master, _fields("job-key", namespace, job, uid), hashlib.sha256).digest()


def sign(key: bytes, identity: Identity, nonce: str, body: bytes, *, purpose: str = STATUS) -> str:
    """`purpose` keeps one kind of signed message from passing for another: a /status
    answer can never be replayed as a store announcement (runtime/launcher/announce.py)."""
    digest = hmac.new(key, _message(purpose, identity, nonce, body), hashlib.sha256)
    return f"{VERSION}={digest.hexdigest()}"


def verify(
    key: bytes,
    identity: Identity,
    nonce: str,
    body: bytes,
    signature: str,
    *,
    purpose: str = STATUS,
) -> bool:
    # compare_digest: the time taken must not tell a forger how much of a guess was right.
    return hmac.compare_digest(sign(key, identity, nonce, body, purpose=purpose), signature)


def valid_nonce(nonce: str) -> bool:
    return 0 < len(nonce) <= NONCE_MAX_CHARS and all(c in "0123456789abcdef" for c in nonce)


def key_to_text(key: bytes) -> str:
    """The form a key takes in a Secret and in the worker's key file: hex, one line."""
    return key.hex()


def key_from_text(text: str) -> bytes:
    """A key from its file; ValueError names what was wrong, never the key."""
    key = bytes.fromhex(text.strip())
    if len(key) != KEY_BYTES:
        raise ValueError(f"status key: {len(key)} bytes, expected {KEY_BYTES}")
    return key


def _message(purpose: str, identity: Identity, nonce: str, body: bytes) -> bytes:
    head = _fields(
        purpose,
        identity.namespace,
        identity.job,
        str(identity.attempt),
        str(identity.rank),
        nonce,
    )
    return head + len(body).to_bytes(8, "big") + body


def _fields(*values: str) -> bytes:
    # Length-prefixed, so no two different tuples encode to the same bytes
    # ("a", "bc") vs ("ab", "c"): a job cannot shift characters between fields.
    out = VERSION.encode()
    for value in values:
        data = value.encode()
        out += len(data).to_bytes(4, "big") + data
    return out
