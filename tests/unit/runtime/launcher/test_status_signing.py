"""The launcher signs its /status answers with the job's mounted key, for the identity it runs as."""

from __future__ import annotations

import http.client
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from trainwave import contract, signatures
from trainwave.runtime.launch import status_signer
from trainwave.runtime.launcher.status import Signer, StatusServer
from trainwave.runtime.settings import load_settings

pytestmark = pytest.mark.timeout(20)

KEY = b"s" * 32
ENV = {
    contract.ENV_JOB_NAME: "llm",
    contract.ENV_JOB_NAMESPACE: "team-a",
    contract.ENV_ATTEMPT: "2",
    contract.ENV_NODE_RANK: "3",
    contract.ENV_RANK: "24",  # the global rank of local rank 0; not the pod's rank
}
ME = signatures.Identity("team-a", "llm", 2, 3)


@contextmanager
def serving(signer: Signer | None) -> Iterator[int]:
    server = StatusServer("127.0.0.1", 0, lambda: {"node_rank": 3}, signer).start()
    try:
        yield server.port
    finally:
        server.stop()


def get(port: int, nonce: str | None) -> tuple[bytes, str | None]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    headers = {contract.STATUS_NONCE_HEADER: nonce} if nonce is not None else {}
    connection.request("GET", contract.STATUS_PATH, headers=headers)
    response = connection.getresponse()
    body = response.read()
    connection.close()
    return body, response.getheader(contract.STATUS_SIGNATURE_HEADER)


def key_file(tmp_path: Path, text: str) -> dict[str, str]:
    path = tmp_path / "key"
    path.write_text(text)
    return {**ENV, contract.ENV_STATUS_KEY_FILE: str(path)}


def test_answers_are_signed_for_the_pods_identity_and_the_operators_nonce(
    tmp_path: Path,
) -> None:
    signer = status_signer(load_settings(key_file(tmp_path, KEY.hex() + "\n")))
    with serving(signer) as port:
        body, signature = get(port, "00ff")
    assert signature is not None
    assert signatures.verify(KEY, ME, "00ff", body, signature)
    assert not signatures.verify(KEY, ME, "00fe", body, signature)  # another request's nonce


@pytest.mark.parametrize(
    "nonce", [None, "", "not-hex!", "a" * 65], ids=["none", "empty", "not-hex", "too-long"]
)
def test_no_signature_without_a_plausible_nonce(tmp_path: Path, nonce: str | None) -> None:
    signer = status_signer(load_settings(key_file(tmp_path, KEY.hex())))
    with serving(signer) as port:
        _, signature = get(port, nonce)
    assert signature is None


@pytest.mark.parametrize(
    ("environ", "said"),
    [
        (ENV, "is not set"),
        ({**ENV, contract.ENV_STATUS_KEY_FILE: "/nonexistent/key"}, "No such file"),
    ],
    ids=["no-key-file", "missing-file"],
)
def test_without_a_key_answers_are_unsigned_and_the_log_says_why(
    environ: dict[str, str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert status_signer(load_settings(environ)) is None
    log = capsys.readouterr().err
    assert '"status-unsigned"' in log
    assert said in log


def test_a_malformed_key_is_named_but_never_printed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert status_signer(load_settings(key_file(tmp_path, "ab" * 16))) is None
    log = capsys.readouterr().err
    assert "16 bytes, expected 32" in log
    assert "ab" * 16 not in log
