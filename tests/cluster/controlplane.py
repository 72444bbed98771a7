"""A real Kubernetes control plane on 127.0.0.1, for tests and demos: up, down, status.

    cluster = ensure_cluster(Path("cluster/topologies/small.yaml"))
    cluster.kubectl("get", "nodes")
    cluster.stop()

With `real_nodes=1` a real kubelet and container runtime join the kwok nodes and
the API server moves to their bridge address (realnode.py).

`ensure_cluster` is idempotent: with a healthy cluster already running in the
state dir it only brings the kwok nodes in line with the topology and returns
in well under a second. Otherwise it wipes the state dir and starts etcd,
kube-apiserver, kube-controller-manager, kube-scheduler and kwok (flags in
components.py), each in its own process group, pids and ports in state.json.
A file lock next to the state dir serialises concurrent callers.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from cluster import components, processes, realnode
from cluster.api import ApiClient, ApiError
from cluster.components import Layout, Ports
from cluster.nodes import NodeChanges, apply_nodes, wait_nodes_ready
from cluster.pki import issue_client_cert, make_pki, write_kubeconfig
from cluster.realnode_net import direct_environment
from cluster.topology import Topology, build_nodes, load_topology

HERE = Path(__file__).resolve().parent
DEFAULT_TOPOLOGY = HERE / "topologies" / "small.yaml"
STAGES = sorted((HERE / "stages").glob("*.yaml"))
START_TIMEOUT = 120.0
# The state is deleted right after, so a clean shutdown buys nothing; the API
# server usually exits in ~1 s but sometimes drains connections for longer.
STOP_GRACE = 3.0
# Clients first, etcd last, so no component spends its shutdown retrying a
# dependency that is already gone.
_STOP_WAVES = (
    ("kwok", "kube-scheduler", "kube-controller-manager"),
    ("kube-apiserver",),
    ("etcd",),
)


def cache_dir() -> Path:
    return Path(os.environ.get("TRAINWAVE_CACHE") or "~/.cache/trainwave").expanduser()


def default_state_dir() -> Path:
    explicit = os.environ.get("TRAINWAVE_CLUSTER_DIR")
    return Path(explicit).expanduser() if explicit else cache_dir() / "cluster"


def tool(name: str) -> Path:
    """A pinned binary from the tools cache, else from PATH; says how to get it if missing."""
    pinned = cache_dir() / "bin" / name
    if os.access(pinned, os.X_OK):
        return pinned
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(
            f"{name} is not in {pinned.parent} nor on PATH; "
            "run `make tools` (tests/cluster/install-tools.sh) to install the pinned tools"
        )
    return Path(found)


@dataclass(frozen=True)
class Cluster:
    """A running local cluster. `started` is True when this call started it."""

    state_dir: Path
    kubeconfig: Path
    server: str
    started: bool
    nodes: NodeChanges
    real_nodes: tuple[str, ...] = ()

    def kubectl(
        self, *args: str, check: bool = True, input: str | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """Run the pinned kubectl against this cluster; output captured as text."""
        environment = _environment() | {"KUBECONFIG": str(self.kubeconfig)}
        result = subprocess.run(
            [str(tool("kubectl")), *args],
            input=input,
            capture_output=True,
            text=True,
            env=environment,
            timeout=timeout,
            check=False,
        )
        if check and result.returncode != 0:
            raise subprocess.CalledProcessError(
                result.returncode, result.args, result.stdout, result.stderr
            )
        return result

    def stop(self) -> None:
        stop_cluster(self.state_dir)


@dataclass(frozen=True)
class ComponentStatus:
    name: str
    pid: int
    alive: bool
    log: str


@dataclass(frozen=True)
class ClusterStatus:
    state_dir: Path
    healthy: bool
    server: str
    kubeconfig: Path
    components: tuple[ComponentStatus, ...]
    topology: str


def ensure_cluster(
    topology: Path = DEFAULT_TOPOLOGY,
    state_dir: Path | None = None,
    timeout: float = START_TIMEOUT,
    *,
    audit_users: Sequence[str] = (),
    real_nodes: int | None = None,
) -> Cluster:
    """Start the cluster unless a healthy one runs in `state_dir`; apply `topology` either way.
    With `audit_users` the API server writes an audit log (Layout.audit_log) of their
    requests; a running cluster audited differently is restarted. `real_nodes` (0 to 4)
    runs that many real kubelets beside the kwok nodes (realnode.py); None keeps what
    runs. A running cluster with another number of real nodes is restarted: the API
    server must listen on the nodes' bridge, which exists only with real nodes."""
    layout = Layout((state_dir or default_state_dir()).resolve())
    # Validate before starting anything: a typo should cost milliseconds.
    parsed = load_topology(topology)
    desired_nodes = build_nodes(parsed)
    with _locked(layout):
        state = _read_state(layout)
        running_real = _real_node_count(state)
        wanted_real = running_real if real_nodes is None else real_nodes
        # A cluster started for fewer nodes renews their leases too often for this many.
        lease_seconds = components.node_lease_seconds(len(desired_nodes))
        started = (
            state is None
            or not _healthy(layout, state)
            or state.get("audit_users", []) != list(audit_users)
            or wanted_real != running_real
            or state.get("node_lease_seconds", components.NODE_LEASE_SECONDS) != lease_seconds
        )
        deadline = time.monotonic() + timeout
        if started:
            _stop(layout)
            state = _start(layout, timeout, audit_users, wanted_real, lease_seconds)
        assert state is not None
        client = ApiClient(state["server"], layout.pki)
        try:
            changes = apply_nodes(client, desired_nodes)
            wait_nodes_ready(client, [n["metadata"]["name"] for n in desired_nodes], timeout)
            if wanted_real:
                _real_nodes_up(layout, state, parsed, client, deadline, fresh=started)
        finally:
            client.close()
        state["topology"] = str(topology.resolve())
        _write_state(layout, state)
    names = tuple(n.name for n in realnode.node_layouts(layout, wanted_real))
    return Cluster(layout.root, layout.kubeconfig, state["server"], started, changes, names)


def stop_cluster(state_dir: Path | None = None) -> bool:
    """Stop every process of the cluster and delete its state; False if nothing ran."""
    layout = Layout((state_dir or default_state_dir()).resolve())
    with _locked(layout):
        return _stop(layout)


def cluster_status(state_dir: Path | None = None) -> ClusterStatus:
    layout = Layout((state_dir or default_state_dir()).resolve())
    state = _read_state(layout) or {}
    records = [processes.ProcessRecord.from_json(p) for p in state.get("processes", [])]
    return ClusterStatus(
        state_dir=layout.root,
        healthy=bool(state) and _healthy(layout, state),
        server=state.get("server", ""),
        kubeconfig=layout.kubeconfig,
        components=tuple(
            ComponentStatus(r.name, r.pid, _is_ours(layout, r.pid), r.log) for r in records
        ),
        topology=state.get("topology", ""),
    )


def _start(
    layout: Layout, timeout: float, audit_users: Sequence[str] = (), real_nodes: int = 0,
    lease_seconds: int = components.NODE_LEASE_SECONDS,
) -> dict[str, Any]:  # fmt: skip
    _prepare_state_dir(layout)
    if audit_users:
        layout.audit_policy.write_text(yaml.safe_dump(components.audit_policy(audit_users)))
    ports = Ports(*_free_ports(6))
    state: dict[str, Any] = {"processes": [], "audit_users": list(audit_users)}
    state["node_lease_seconds"] = lease_seconds
    node_host = ""
    if real_nodes:
        # Before the API server: it binds to the bridge this creates.
        node_host = realnode.prepare_host(
            layout, state, real_nodes, lambda: _write_state(layout, state)
        )
    server = components.api_server_url(ports, node_host or "127.0.0.1")
    make_pki(layout.pki.directory, extra_ips=(node_host,) if node_host else ())
    if node_host:
        issue_client_cert(
            layout.pki,
            layout.pki.apiserver_kubelet_client_key,
            layout.pki.apiserver_kubelet_client_cert,
            user="kube-apiserver-kubelet-client",
            group="system:masters",
        )
    write_kubeconfig(layout.kubeconfig, server, layout.pki)
    layout.scheduler_config.write_text(yaml.safe_dump(components.scheduler_config(layout)))
    layout.kwok_config.write_text(yaml.safe_dump(components.kwok_config()))
    layout.kwok_workdir.mkdir()
    state |= {"server": server, "ports": ports.to_json(), "node_host": node_host}
    _write_state(layout, state)
    environment = _environment()
    deadline = time.monotonic() + timeout

    def launch(name: str, argv: list[str], env: dict[str, str] = environment) -> None:
        record = processes.spawn(name, _profiled(argv), layout.log(name), layout.root, env)
        state["processes"].append(record.to_json())
        _write_state(layout, state)  # at once, so `down` finds it even if `up` dies

    try:
        launch("etcd", components.etcd_command(tool("etcd"), layout, ports))
        _wait_until(layout, state, deadline, "etcd", lambda: _etcd_healthy(ports))
        launch(
            "kube-apiserver",
            components.apiserver_command(
                tool("kube-apiserver"),
                layout,
                ports,
                audit=bool(audit_users),
                node_host=node_host,
            ),
        )
        client = ApiClient(server, layout.pki, timeout=5)
        _wait_until(layout, state, deadline, "kube-apiserver /readyz", lambda: _ready(client))
        launch(
            "kube-controller-manager",
            components.controller_manager_command(
                tool("kube-controller-manager"), layout, ports, lease_seconds
            ),
        )
        launch(
            "kube-scheduler", components.scheduler_command(tool("kube-scheduler"), layout, ports)
        )
        launch(
            "kwok",
            components.kwok_command(tool("kwok"), layout, ports, STAGES, lease_seconds),
            components.kwok_environment(layout, environment),
        )
        _wait_until(
            layout, state, deadline, "ServiceAccount default/default (kube-controller-manager)",
            lambda: _exists(client, "/api/v1/namespaces/default/serviceaccounts/default"),
        )  # fmt: skip
        _wait_until(
            layout, state, deadline, "kube-scheduler /healthz",
            lambda: _https_ok(ports.scheduler, "/healthz"),
        )  # fmt: skip
        _wait_until(
            layout, state, deadline, "kwok /healthz",
            lambda: _http_ok(f"http://127.0.0.1:{ports.kwok}/healthz"),
        )  # fmt: skip
        client.close()
    except BaseException:
        # Leave no half-started cluster behind; keep the logs for the error.
        processes.stop_groups([p["pid"] for p in reversed(state["processes"])], STOP_GRACE)
        raise
    return state


def _profiled(argv: list[str]) -> list[str]:
    """With TRAINWAVE_CLUSTER_PROFILING=1 the Kubernetes components serve Go's pprof
    (/debug/pprof on their secure ports, for a benchmark's diagnosis); off otherwise,
    as in a hardened cluster."""
    if os.environ.get("TRAINWAVE_CLUSTER_PROFILING") != "1":
        return argv
    return ["--profiling=true" if arg == "--profiling=false" else arg for arg in argv]


def _environment() -> dict[str, str]:
    return direct_environment()


def _real_node_count(state: dict[str, Any] | None) -> int:
    return int(((state or {}).get("real_nodes") or {}).get("count", 0))


def _real_nodes_up(
    layout: Layout,
    state: dict[str, Any],
    topology: Topology,
    client: ApiClient,
    deadline: float,
    *,
    fresh: bool,
) -> None:
    """Start the real nodes on a fresh cluster, refresh them on a running one."""
    environment = _environment()

    def launch(name: str, argv: list[str], env: dict[str, str] = environment) -> None:
        log = layout.log(name.replace("/", "-"))
        record = processes.spawn(name, argv, log, layout.root, env)
        state["processes"].append(record.to_json())
        _write_state(layout, state)

    context = realnode.Context(
        layout, state, tool, launch, lambda: _write_state(layout, state), deadline
    )
    if not fresh:
        realnode.refresh_nodes(context, topology, client)
        return
    try:
        realnode.start_nodes(context, topology, client)
    except BaseException:
        _stop(layout, keep_state=True)  # keep the logs for the error
        raise


def _stop(layout: Layout, *, keep_state: bool = False) -> bool:
    state = _read_state(layout) or {}
    problems = realnode.teardown(layout, state)
    for problem in problems:
        print(f"cluster down: could not undo: {problem}", file=sys.stderr)
    records = [processes.ProcessRecord.from_json(p) for p in state.get("processes", [])]
    running = {r.name: r.pid for r in records if _is_ours(layout, r.pid)}
    for wave in _STOP_WAVES:
        processes.stop_groups([running[name] for name in wave if name in running], STOP_GRACE)
    # A crashed `up` may have started processes it never recorded.
    strays = processes.processes_referencing(str(layout.root) + "/")
    processes.stop_groups(strays, STOP_GRACE)
    was_running = bool(running or strays)
    if keep_state:
        return was_running
    if layout.root.exists():
        if layout.marker.exists():
            shutil.rmtree(layout.root)
        elif any(layout.root.iterdir()):
            raise RuntimeError(
                f"refusing to delete {layout.root}: not a trainwave cluster dir (no "
                f"{layout.marker.name}); set TRAINWAVE_CLUSTER_DIR to a dedicated directory"
            )
    return was_running


def _prepare_state_dir(layout: Layout) -> None:
    if layout.root.exists() and any(layout.root.iterdir()) and not layout.marker.exists():
        raise RuntimeError(
            f"{layout.root} is not empty and not a trainwave cluster dir; "
            "set TRAINWAVE_CLUSTER_DIR to a dedicated directory"
        )
    shutil.rmtree(layout.root, ignore_errors=True)
    layout.root.mkdir(parents=True)
    layout.marker.write_text("state of a local trainwave control plane; `down` deletes it\n")


def _healthy(layout: Layout, state: dict[str, Any]) -> bool:
    records = state.get("processes", [])
    expected = [*components.COMPONENTS, *realnode.process_names(_real_node_count(state))]
    if [p["name"] for p in records] != expected:
        return False
    if not all(_is_ours(layout, p["pid"]) for p in records):
        return False
    client = ApiClient(state["server"], layout.pki, timeout=3)
    try:
        return _ready(client) and realnode.healthy(layout, state, client)
    finally:
        client.close()


def _is_ours(layout: Layout, pid: int) -> bool:
    # A recorded pid may have been reused after a reboot: it must still be a
    # process started with our state dir in its flags.
    return processes.is_alive(pid) and str(layout.root) in processes.command_line(pid)


def _wait_until(
    layout: Layout, state: dict[str, Any], deadline: float, what: str, check: Callable[[], bool]
) -> None:
    while not check():
        for record in state["processes"]:
            if not processes.is_alive(record["pid"]):
                raise RuntimeError(
                    f"{record['name']} exited while waiting for {what}; "
                    f"last lines of {record['log']}:\n{_tail(Path(record['log']))}"
                )
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}; logs in {layout.logs}")
        time.sleep(0.1)


def _ready(client: ApiClient) -> bool:
    try:
        status, _ = client.get_text("/readyz")
    except OSError:
        return False
    return status == 200


def _exists(client: ApiClient, path: str) -> bool:
    try:
        client.get(path)
    except ApiError as error:
        if error.status == 404:
            return False
        raise
    except OSError:
        return False
    return True


def _etcd_healthy(ports: Ports) -> bool:
    return _http_ok(f"http://127.0.0.1:{ports.etcd_client}/health")


def _http_ok(url: str, context: ssl.SSLContext | None = None) -> bool:
    # An empty ProxyHandler: urllib would otherwise honour http_proxy even for 127.0.0.1.
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context)
    )
    try:
        with opener.open(url, timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def _https_ok(port: int, path: str) -> bool:
    # The scheduler serves a self-signed cert it made at start: nothing to verify against.
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return _http_ok(f"https://127.0.0.1:{port}{path}", context)


def _free_ports(count: int) -> list[int]:
    """Ports the kernel picks as free on 127.0.0.1; held together so they differ."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]


def _read_state(layout: Layout) -> dict[str, Any] | None:
    try:
        return dict(json.loads(layout.state_file.read_text()))
    except (OSError, ValueError):
        return None


def _write_state(layout: Layout, state: dict[str, Any]) -> None:
    temporary = layout.state_file.with_suffix(".tmp")
    temporary.write_text(json.dumps(state, indent=2))
    temporary.replace(layout.state_file)


@contextlib.contextmanager
def _locked(layout: Layout) -> Iterator[None]:
    lock = layout.root.with_name(layout.root.name + ".lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
