"""The test kubelet's pure parts: Kubernetes file formats, pod resolution, pod status."""

from __future__ import annotations

from typing import Any

import pytest

from e2e.formats import PodAddress, format_map, go_quote, hosts_file
from e2e.kubelet import AddressPool
from e2e.podrun import sandbox_unavailable
from e2e.podspec import PodContext, Unsupported, expand, field_value, plan_containers
from e2e.podstatus import PodState
from trainwave.runtime.launcher.podinfo import parse_annotations, unquote_go

NOW = "2026-11-22T03:00:00Z"
LATER = "2026-11-22T03:00:05Z"


def make_pod(*, containers: list[dict[str, Any]] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "job-a0-worker-1",
            "namespace": "team",
            "uid": "u-1",
            "labels": {"rank": "1"},
            "annotations": {"trainwave.io/node": "n1"},
        },
        "spec": {
            "nodeName": "n1",
            "hostname": "job-worker-1",
            "subdomain": "job",
            "containers": containers or [{"name": "worker", "command": ["python", "t.py"]}],
            **spec,
        },
        "status": {"conditions": [{"type": "PodScheduled", "status": "True"}]},
    }


CONTEXT = PodContext(ip="127.0.0.7", host_ip="127.0.0.1", base_env={"PATH": "/venv/bin"})


@pytest.mark.parametrize(
    ("text", "quoted"),
    [
        ("plain", '"plain"'),
        ('say "hi"\n', '"say \\"hi\\"\\n"'),
        ("tab\tback\\slash", '"tab\\tback\\\\slash"'),
        ("\x01\x7f", '"\\x01\\x7f"'),
        ("café 日本", '"café 日本"'),
        ("no\u00a0break", '"no\\u00a0break"'),
        ("\U000e0001", '"\\U000e0001"'),
    ],
    ids=["plain", "quotes-newline", "tab-backslash", "control", "unicode", "nbsp", "non-bmp"],
)
def test_go_quote_matches_go_and_the_runtime_reads_it_back(text: str, quoted: str) -> None:
    assert go_quote(text) == quoted
    assert unquote_go(quoted) == text


def test_downward_map_file_is_sorted_without_final_newline_and_parses_back() -> None:
    entries = {"b": "two\nlines", "a": '{"json": true}'}

    text = format_map(entries)

    assert text == 'a="{\\"json\\": true}"\nb="two\\nlines"'
    assert parse_annotations(text) == entries


def test_hosts_file_names_the_pod_first_then_its_live_peers() -> None:
    own = PodAddress("127.0.0.3", "job-worker-1", "job", "team")
    peer = PodAddress("127.0.0.2", "job-worker-0", "job", "team")

    lines = hosts_file(own, [peer, own]).splitlines()

    assert "127.0.0.1\tlocalhost" in lines
    assert lines[-2:] == [
        "127.0.0.3\tjob-worker-1.job.team.svc.cluster.local job-worker-1.job job-worker-1",
        "127.0.0.2\tjob-worker-0.job.team.svc.cluster.local job-worker-0.job job-worker-0",
    ]


@pytest.mark.parametrize(
    ("text", "expanded"),
    [
        ("$(RANK)", "1"),
        ("r$(RANK)-$(MISSING)", "r1-$(MISSING)"),
        ("$$(RANK)", "$(RANK)"),
        ("cost$$5", "cost$5"),
    ],
    ids=["defined", "undefined-kept", "escaped-reference", "escaped-dollar"],
)
def test_expand_follows_kubernetes_rules(text: str, expanded: str) -> None:
    assert expand(text, {"RANK": "1"}) == expanded


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("metadata.name", "job-a0-worker-1"),
        ("metadata.namespace", "team"),
        ("status.podIP", "127.0.0.7"),
        ("spec.nodeName", "n1"),
        ("metadata.annotations['trainwave.io/node']", "n1"),
        ("metadata.labels['rank']", "1"),
    ],
    ids=["name", "namespace", "pod-ip", "node", "annotation", "label"],
)
def test_field_values(path: str, value: str) -> None:
    assert field_value(path, make_pod(), CONTEXT) == value


def test_unknown_field_path_is_refused_by_name() -> None:
    with pytest.raises(Unsupported, match=r"fieldPath 'spec\.priority'.*accepted: metadata\.name"):
        field_value("spec.priority", make_pod(), CONTEXT)


def test_container_env_in_order_with_field_refs_and_expanded_args() -> None:
    worker = {
        "name": "worker",
        "command": ["python", "-m", "x"],
        "args": ["--host", "$(MY_IP)"],
        "env": [
            {"name": "MY_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "ADDR", "value": "$(MY_IP):29500"},
        ],
        "volumeMounts": [{"name": "ckpt", "mountPath": "/ckpt", "readOnly": True}],
        "workingDir": "/work",
    }

    init, (plan,) = plan_containers(make_pod(containers=[worker]), CONTEXT)

    assert init == ()
    assert plan.argv == ("python", "-m", "x", "--host", "127.0.0.7")
    assert plan.env["ADDR"] == "127.0.0.7:29500"
    assert plan.env["PATH"] == "/venv/bin"
    assert plan.env["HOSTNAME"] == "job-worker-1"
    assert (plan.cwd, plan.mounts[0].path, plan.mounts[0].read_only) == ("/work", "/ckpt", True)


@pytest.mark.parametrize(
    ("container", "message"),
    [
        ({"name": "worker", "image": "x"}, r"containers\[worker\]\.command is empty"),
        (
            {"name": "worker", "command": ["a"], "envFrom": [{"configMapRef": {"name": "c"}}]},
            r"containers\[worker\]\.envFrom",
        ),
        (
            {
                "name": "worker",
                "command": ["a"],
                "env": [{"name": "S", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}],
            },
            r"env\[0\] \(S\)\.valueFrom\.secretKeyRef: only fieldRef",
        ),
    ],
    ids=["no-command", "env-from", "secret-ref"],
)
def test_what_the_kubelet_cannot_emulate_fails_naming_the_field(
    container: dict[str, Any], message: str
) -> None:
    with pytest.raises(Unsupported, match=message):
        plan_containers(make_pod(containers=[container]), CONTEXT)


def pod_state(init: int = 0) -> PodState:
    pod = make_pod(initContainers=[{"name": f"init-{i}"} for i in range(init)])
    return PodState.of(pod, "127.0.0.7", "127.0.0.1", NOW)


def _run_init(state: PodState, code: int) -> None:
    state.init[0].start(NOW)
    state.init[0].exit(code, LATER)


def _start_worker(state: PodState) -> None:
    _run_init(state, 0)
    state.main[0].start(NOW)


def _worker_exits(code: int) -> Any:
    def act(state: PodState) -> None:
        _start_worker(state)
        state.main[0].exit(code, LATER)

    return act


@pytest.mark.parametrize(
    ("act", "phase", "ready"),
    [
        (lambda state: None, "Pending", False),
        (lambda state: state.init[0].start(NOW), "Pending", False),
        (lambda state: _run_init(state, 1), "Failed", False),
        (_start_worker, "Running", True),
        (_worker_exits(0), "Succeeded", False),
        (_worker_exits(137), "Failed", False),
    ],
    ids=["created", "init-running", "init-failed", "running", "succeeded", "killed"],
)
def test_pod_phase_and_readiness(act: Any, phase: str, ready: bool) -> None:
    state = pod_state(init=1)
    act(state)

    status = state.status(LATER, [{"type": "PodScheduled", "status": "True"}])

    assert status["phase"] == phase
    conditions = {c["type"]: c["status"] for c in status["conditions"]}
    assert conditions["PodScheduled"] == "True"
    assert conditions["Ready"] == ("True" if ready else "False")
    assert (status["podIP"], status["hostIP"]) == ("127.0.0.7", "127.0.0.1")


def test_terminated_container_status_has_code_reason_and_times() -> None:
    state = pod_state()
    state.main[0].start(NOW)
    state.main[0].exit(137, LATER)

    (worker,) = state.status(LATER)["containerStatuses"]

    assert worker["state"]["terminated"] == {
        "exitCode": 137,
        "reason": "Error",
        "startedAt": NOW,
        "finishedAt": LATER,
    }


def test_ready_keeps_its_transition_time_while_it_holds() -> None:
    state = pod_state()
    state.main[0].start(NOW)
    first = state.status(NOW)["conditions"]

    again = state.status(LATER, first)["conditions"]

    ready = next(c for c in again if c["type"] == "Ready")
    assert (ready["status"], ready["lastTransitionTime"]) == ("True", NOW)


def test_addresses_are_not_reused_at_once_and_run_out_loudly() -> None:
    pool = AddressPool()
    first = pool.allocate()
    pool.release(first)
    assert pool.allocate() != first
    for _ in range(252):
        pool.allocate()
    with pytest.raises(RuntimeError, match="253 loopback pod addresses"):
        pool.allocate()


def test_missing_namespace_tools_give_a_skip_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")

    assert "no unshare or setpriv on PATH" in (sandbox_unavailable() or "")
