"""The store host's announcement: signed as the job's worker 0, checked against the
rendezvous, delivered over the status port, and what the launcher does with its address."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from trainwave import contract, signatures
from trainwave.runtime import launch
from trainwave.runtime.launcher import announce
from trainwave.runtime.launcher.status import StatusServer
from trainwave.runtime.settings import load_settings

pytestmark = pytest.mark.timeout(30)

KEY = b"k" * 32
RDZV = "uid-1-a2"
HOST = signatures.Identity("team-a", "llm", 2, 0)
KEPT = signatures.Identity("team-a", "llm", 2, 1)


NOW = 1_800_000_000.0  # the receiver's wall clock in these tests
SENDER = "10.1.2.3"


def signed(
    body: bytes, key: bytes = KEY, who: signatures.Identity = HOST, purpose: str = "store"
) -> tuple[bytes, str, str]:
    nonce = signatures.new_nonce()
    return body, nonce, signatures.sign(key, who, nonce, body, purpose=purpose)


def body(rendezvous: str = RDZV, address: str = SENDER, sent_at: float = NOW - 3) -> bytes:
    return announce.body(rendezvous, address, sent_at)


def receiver() -> announce.Announcements:
    return announce.Announcements(KEY, KEPT, RDZV, clock=lambda: 7.0, wall=lambda: NOW)


def test_a_signed_announcement_of_this_rendezvous_is_kept_with_the_senders_address() -> None:
    heard = receiver()
    assert heard.newest() is None
    code, answer = heard.receive(*signed(body()), sender=SENDER)
    assert (code, answer) == (200, {"address": SENDER})
    assert heard.newest() == announce.Heard(address=SENDER, received=7.0)
    heard.receive(*signed(body(address="10.1.2.9")), sender="10.1.2.9")  # a newer one wins
    assert heard.newest() is not None
    assert heard.newest().address == "10.1.2.9"


def test_an_ipv4_sender_seen_on_a_dual_stack_socket_is_the_same_address() -> None:
    assert receiver().receive(*signed(body()), sender=f"::ffff:{SENDER}")[0] == 200


@pytest.mark.parametrize(
    "message",
    [
        pytest.param(signed(body(address="10.9.9.9")), id="names-another-address"),
        pytest.param(signed(body(address="not-an-ip")), id="names-no-address"),
        pytest.param(signed(body(sent_at=NOW - 61)), id="sent-too-long-ago"),
        pytest.param(signed(body(sent_at=NOW + 61)), id="sent-from-the-future"),
        pytest.param(
            signed(json.dumps({"rdzv_id": RDZV, "sent_at": NOW}).encode()), id="no-address"
        ),
    ],
)
def test_a_replay_from_elsewhere_or_later_is_refused(message: tuple[bytes, str, str]) -> None:
    """The signature holds, so these are replays (or a confused sender): the address must
    be where the connection came from, and the time within MAX_AGE_SECONDS of ours."""
    heard = receiver()
    code, answer = heard.receive(*message, sender=SENDER)
    assert code == 409, answer
    assert heard.newest() is None


@pytest.mark.parametrize(
    ("message", "code"),
    [
        pytest.param(signed(body(), key=b"x" * 32), 403, id="another-jobs-key"),
        pytest.param(signed(body(), who=KEPT), 403, id="not-worker-0"),
        pytest.param(
            signed(body(), who=signatures.Identity("team-a", "llm", 1, 0)),
            403,
            id="another-attempt",
        ),
        pytest.param(signed(body(), purpose="status"), 403, id="a-status-answer"),
        pytest.param(signed(body(rendezvous="uid-1-a1")), 409, id="another-rendezvous"),
        pytest.param(signed(b"not json"), 400, id="not-json"),
        pytest.param(signed(b"[1]"), 400, id="not-an-object"),
        pytest.param(signed(body(sent_at="now")), 400, id="sent-at-not-a-number"),  # type: ignore[arg-type]
        pytest.param((body(), "", ""), 400, id="unsigned"),
    ],
)
def test_anything_else_is_refused_and_changes_nothing(
    message: tuple[bytes, str, str], code: int
) -> None:
    heard = receiver()
    assert heard.receive(*message, sender=SENDER)[0] == code
    assert heard.newest() is None


def test_a_worker_without_the_key_accepts_nothing() -> None:
    heard = announce.Announcements(None, KEPT, RDZV)
    assert not heard.accepting
    assert heard.receive(*signed(body()), sender=SENDER)[0] == 403


@contextmanager
def kept_worker(heard: announce.Announcements) -> Iterator[int]:
    posts = {contract.STORE_PATH: heard.receive}
    server = StatusServer("127.0.0.1", 0, lambda: {}, None, posts=posts).start()
    try:
        yield server.port
    finally:
        server.stop()


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.parametrize(
    "source",
    [
        pytest.param("127.0.0.1", id="reaches-a-kept-worker"),
        # Another loopback address than the kernel would choose: sent from the pod's IP
        # whatever the route, so the receiver's check holds on a multi-homed host.
        pytest.param("127.0.0.2", id="leaves-from-the-address-it-names"),
    ],
)
def test_the_announcement_reaches_a_kept_worker_from_its_address(source: str) -> None:
    heard = announce.Announcements(KEY, KEPT, RDZV)
    with kept_worker(heard) as port:
        sent = announce.announce(["127.0.0.1"], port, RDZV, KEY, HOST, address=source)
    assert sent == {"127.0.0.1": "ok"}
    assert heard.newest() is not None
    assert heard.newest().address == source


def test_a_refused_announcement_is_reported_once_and_a_missing_peer_after_its_tries() -> None:
    heard = announce.Announcements(KEY, KEPT, "another-rendezvous")
    with kept_worker(heard) as port:
        refused = announce.announce(
            ["127.0.0.1"], port, RDZV, KEY, HOST, address="127.0.0.1", tries=3, pause=0
        )
    assert refused == {"127.0.0.1": "refused: HTTP 409"}
    gone = announce.announce(
        ["127.0.0.1"], closed_port(), RDZV, KEY, HOST, address="127.0.0.1", tries=2, pause=0
    )
    assert "Connection refused" in gone["127.0.0.1"]
    assert "HTTP" not in gone["127.0.0.1"]


def test_the_status_port_refuses_posts_it_does_not_serve() -> None:
    import http.client

    server = StatusServer("127.0.0.1", 0, lambda: {}).start()
    try:
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
        connection.request("POST", contract.STORE_PATH, body=b"{}")
        answer = connection.getresponse()
        assert answer.status == 404
        assert "POST only []" in json.loads(answer.read())["error"]
    finally:
        server.stop()


IN_PLACE = {
    "PET_RDZV_BACKEND": "c10d",
    "PET_MAX_RESTARTS": "3",
    "PET_NNODES": "3",
    "PET_RDZV_ENDPOINT": "llm-worker-0.llm:29400",
    "TRAINWAVE_WORKER_ADDRESS": "llm-worker-{rank}.llm",
}


def test_the_store_host_names_itself_by_its_pod_ip_which_sorts_first() -> None:
    settings = load_settings({**IN_PLACE, "PET_RDZV_CONF": "is_host=true", "NODE_RANK": "0"})
    env = {**IN_PLACE, contract.ENV_POD_IP: "10.244.1.5"}
    changed = launch.agent_env(settings, env)
    assert changed[contract.ENV_PET_LOCAL_ADDR] == "10.244.1.5"
    assert changed[contract.ENV_PET_RDZV_ENDPOINT] == "127.0.0.1:29400"
    # torch ranks the agents by their sorted addresses: worker 0 stays rank 0.
    assert sorted(["10.244.1.5", *settings.in_place.peers])[0] == "10.244.1.5"


def test_an_address_that_would_not_sort_first_keeps_the_name() -> None:
    environ = {**IN_PLACE, "TRAINWAVE_WORKER_ADDRESS": "0a-worker-{rank}.0a"}
    settings = load_settings({**environ, "PET_RDZV_CONF": "is_host=true", "NODE_RANK": "0"})
    changed = launch.agent_env(settings, {**environ, contract.ENV_POD_IP: "10.244.1.5"})
    assert contract.ENV_PET_LOCAL_ADDR not in changed


def test_other_workers_keep_their_names_and_endpoint() -> None:
    settings = load_settings({**IN_PLACE, "PET_RDZV_CONF": "is_host=false", "NODE_RANK": "1"})
    changed = launch.agent_env(settings, {**IN_PLACE, contract.ENV_POD_IP: "10.244.1.6"})
    assert set(changed) == {"TORCHELASTIC_ERROR_FILE"}
