"""The agent's pass and loop, shared-GPU selection and the fake GPU file; no cluster.

`publish` here is a plain recording function: these tests are about what the
agent decides to send and how it survives failures. What the API server does
with it is tested against the real control plane (tests/integration/test_agent_publishes.py).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest
from agent_trees import GPU_MEMORY_MIB, make_backend, make_node

import trainwave
from trainwave import cli
from trainwave.agent.changes import Change, DesiredNode
from trainwave.agent.discovery import discover
from trainwave.agent.fake_gpus import FakeGpusError, fake_gpus_document, load_fake_gpus
from trainwave.agent.running import Agent, AgentOptions, PassError, desired_node
from trainwave.agent.sharing import SharedSelection, SharingError, parse_selection, shared_gpus
from trainwave.contract import ANNOTATION_INVENTORY, SHARED_GPU_MEMORY_RESOURCE

pytestmark = pytest.mark.timeout(10)

SOURCE_ROOT = Path(trainwave.__file__).resolve().parents[1]  # this checkout's operator/


class Refused(Exception):
    """Stands in for publishing.PublishError."""


class Recorder:
    """A `publish` that records what it was given, and fails the first `failures` calls."""

    def __init__(self, failures: int = 0) -> None:
        self.failures = failures
        self.calls: list[DesiredNode] = []

    def __call__(self, desired: DesiredNode) -> Sequence[Change]:
        self.calls.append(desired)
        if len(self.calls) <= self.failures:
            raise Refused(f"forbidden (call {len(self.calls)})")
        return ()


def write_gpus(path: Path, gpus: int = 8) -> Path:
    path.write_text(json.dumps(fake_gpus_document(make_backend(gpus, switched=[range(gpus)]))))
    return path


def make_agent(tmp_path: Path, publish: Recorder, shared: str = "none", gpus: int = 8) -> Agent:
    make_node(tmp_path / "root", gpus=gpus)
    options = AgentOptions(
        node_name="node-a",
        root=tmp_path / "root",
        shared=parse_selection(shared),
        fake_gpus=write_gpus(tmp_path / "gpus.json", gpus),
    )
    return Agent(options, publish, publish_errors=(Refused,))


# --- --shared-gpus ------------------------------------------------------------------------

SELECTIONS = [
    pytest.param("none", SharedSelection(), (), id="none"),
    pytest.param("", SharedSelection(), (), id="empty-is-none"),
    pytest.param("all", SharedSelection(every_gpu=True), tuple(range(8)), id="all"),
    pytest.param("ALL", SharedSelection(every_gpu=True), tuple(range(8)), id="case-insensitive"),
    pytest.param("3, 1", SharedSelection(indexes=frozenset({1, 3})), (1, 3), id="indexes-sorted"),
]


@pytest.mark.parametrize(("text", "selection", "indexes"), SELECTIONS)
def test_parse_selection(
    text: str, selection: SharedSelection, indexes: tuple[int, ...], tmp_path: Path
) -> None:
    make_node(tmp_path)
    inventory = discover(make_backend(8), tmp_path)

    assert parse_selection(text) == selection
    assert tuple(gpu.index for gpu in shared_gpus(selection, inventory.gpus)) == indexes


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("some", "expected 'none', 'all' or comma-separated", id="word"),
        pytest.param("0,-1", "expected 'none', 'all' or comma-separated", id="negative"),
        pytest.param("0,,1", "expected 'none', 'all' or comma-separated", id="empty-item"),
    ],
)
def test_parse_selection_rejects(text: str, message: str) -> None:
    with pytest.raises(SharingError, match=message):
        parse_selection(text)


def test_selection_beyond_the_node_names_the_gpus_found(tmp_path: Path) -> None:
    make_node(tmp_path, gpus=2)
    gpus = discover(make_backend(2), tmp_path).gpus

    with pytest.raises(SharingError, match=r"--shared-gpus 1,5: GPU index\(es\) 5 .* found: 0-1"):
        shared_gpus(parse_selection("1,5"), gpus)


# --- the fake GPU file --------------------------------------------------------------------


def test_fake_gpu_file_round_trips(tmp_path: Path) -> None:
    backend = load_fake_gpus(write_gpus(tmp_path / "gpus.json", 4))
    make_node(tmp_path / "root", gpus=4)

    assert backend.count() == 4
    assert discover(backend, tmp_path / "root").nvlink_islands == ((0, 1, 2, 3),)


BAD_FILES = [
    pytest.param("{", "cannot read JSON", id="not-json"),
    pytest.param("[]", "document: Input should be a valid dictionary", id="not-an-object"),
    pytest.param('{"gpus": [{"uuid": "G"}]}', "gpus.0.name: Field required", id="missing-field"),
    pytest.param(
        '{"gpus": [{"uuid": "G", "name": "H", "memoryMiB": 0, "pciBusId": "0000:10:00.0"}]}',
        r"gpus.0.memoryMiB: Input should be greater than or equal to 1 \(got 0\)",
        id="zero-memory",
    ),
    pytest.param(
        '{"gpus": [], "nvlinks": [[0, 1]]}',
        r"nvlinks/switched name GPU index\(es\) \[0, 1\]",
        id="link-to-missing-gpu",
    ),
    pytest.param('{"gpus": [], "gpu": []}', "gpu: Extra inputs are not permitted", id="typo"),
]


@pytest.mark.parametrize(("text", "message"), BAD_FILES)
def test_fake_gpu_file_errors_name_the_field(text: str, message: str, tmp_path: Path) -> None:
    path = tmp_path / "gpus.json"
    path.write_text(text)
    with pytest.raises(FakeGpusError, match=f"--fake-gpus {path}: .*{message}"):
        load_fake_gpus(path)


# --- one pass -----------------------------------------------------------------------------


def test_desired_node_shares_the_selected_gpus(tmp_path: Path) -> None:
    make_node(tmp_path)
    inventory = discover(make_backend(8), tmp_path)
    node = desired_node(inventory, "node-a", parse_selection("2,5"))

    shared = json.loads(node.annotations[ANNOTATION_INVENTORY])["sharedGpus"]
    assert shared == [
        {"index": i, "uuid": inventory.gpus[i].uuid, "memoryMiB": GPU_MEMORY_MIB} for i in (2, 5)
    ]
    assert node.resources == {SHARED_GPU_MEMORY_RESOURCE: 2 * GPU_MEMORY_MIB}
    assert node.labels["trainwave.io/nvlink-domain"] == "node-a"


def test_no_sharing_no_resource(tmp_path: Path) -> None:
    make_node(tmp_path)
    node = desired_node(discover(make_backend(8), tmp_path), "n", SharedSelection())

    assert node.resources == {}
    assert json.loads(node.annotations[ANNOTATION_INVENTORY])["sharedGpus"] == []


def test_pass_publishes_what_it_discovered(tmp_path: Path) -> None:
    publish = Recorder()
    assert make_agent(tmp_path, publish, shared="all").run_once()

    (sent,) = publish.calls
    assert sent.labels["nvidia.com/gpu.count"] == "8"
    assert sent.resources == {SHARED_GPU_MEMORY_RESOURCE: 8 * GPU_MEMORY_MIB}


@pytest.mark.parametrize(
    ("broken", "message"),
    [
        pytest.param("gpus-file", "--fake-gpus .*cannot read JSON", id="bad-gpu-file"),
        pytest.param("shared", "--shared-gpus 9: GPU index", id="sharing-a-missing-gpu"),
    ],
)
def test_failed_discovery_publishes_nothing(broken: str, message: str, tmp_path: Path) -> None:
    publish = Recorder()
    agent = make_agent(tmp_path, publish, shared="9" if broken == "shared" else "none")
    if broken == "gpus-file":
        (tmp_path / "gpus.json").write_text("{")

    with pytest.raises(PassError, match=message):
        agent.run_pass()
    assert publish.calls == []  # a broken pass never strips the node's labels


def test_refused_publish_is_reported_not_raised(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    agent = make_agent(tmp_path, Recorder(failures=1))

    assert agent.run_once() is False
    assert "node=node-a pass failed: forbidden (call 1)" in caplog.text


def test_loop_retries_until_the_api_accepts(tmp_path: Path) -> None:
    stop = threading.Event()

    class StopAfterSuccess(Recorder):
        def __call__(self, desired: DesiredNode) -> Sequence[Change]:
            result = super().__call__(desired)
            stop.set()  # reached only when the call did not raise
            return result

    publish = StopAfterSuccess(failures=2)
    make_agent(tmp_path, publish).run_forever(interval=0.01, stop=stop)

    assert len(publish.calls) == 3  # two refusals, then the pass that went through


def test_wake_starts_the_next_pass_before_the_interval(tmp_path: Path) -> None:
    stop, wake = threading.Event(), threading.Event()

    class WakeThenStop(Recorder):
        def __call__(self, desired: DesiredNode) -> Sequence[Change]:
            result = super().__call__(desired)
            if len(self.calls) == 2:
                stop.set()  # and wake, as the agent's SIGTERM handler does
            wake.set()
            return result

    publish = WakeThenStop()
    # An hour's interval: only the wake can bring the second pass within the timeout.
    make_agent(tmp_path, publish).run_forever(interval=3600, stop=stop, wake=wake)

    assert len(publish.calls) == 2
    assert not wake.is_set(), "cleared for the next wait"


def test_problems_are_logged_when_they_change(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    agent = make_agent(tmp_path, Recorder())
    (tmp_path / "root/sys/class/infiniband/mlx5_1/ports/1/rate").write_text("fast\n")

    for _ in range(3):
        agent.run_once()

    assert caplog.text.count("rate: 'fast', expected") == 1


# --- the command line ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(["--interval", "0"], "'0': expected a number of seconds above 0", id="zero"),
        pytest.param(["--interval", "soon"], "'soon': expected a number", id="not-a-number"),
        pytest.param(["--shared-gpus", "half"], "--shared-gpus 'half': expected", id="sharing"),
    ],
)
def test_cli_rejects_bad_flags(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["agent", "--node-name", "n", *args])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_cli_needs_a_node_name(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    assert cli.main(["agent", "--once"]) == 2
    assert "no node name: pass --node-name or set $NODE_NAME" in capsys.readouterr().err


@pytest.mark.timeout(40)  # a Python process importing the Kubernetes client, on 2 busy cores
def test_unreachable_api_server_is_reported(tmp_path: Path) -> None:
    """A real client against a closed port on loopback: one clear line, exit code 1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again below: nothing listens there
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": f"https://127.0.0.1:{port}"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    agent = make_agent(tmp_path, Recorder())
    result = subprocess.run(
        [sys.executable, "-m", "trainwave.cli", "agent", "--once", "--node-name", "node-a",
         "--root", str(agent.options.root), "--fake-gpus", str(agent.options.fake_gpus)],
        env=os.environ | {"KUBECONFIG": str(kubeconfig), "PYTHONPATH": str(SOURCE_ROOT)},
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip

    assert result.returncode == 1
    assert f"get nodes/node-a: cannot reach the API server at https://127.0.0.1:{port}" in (
        result.stderr
    )
