"""Install trainwave into the local cluster, and run its operator as a local process.

With a real node (`make demo`, the e2e tier) the chart is installed from the cluster's
registry (`registry_values`, `apply_pull_secret`) and the operator runs as the chart's
pods. On kwok nodes alone (the integration tier) there is no container runtime: the
chart's Deployment gets a pod that kwok only pretends to run, and the operator runs as a
process on this machine (`OperatorProcess`), authenticated with a token of the chart's
ServiceAccount: it has exactly the chart's RBAC, no more (an admin kubeconfig would hide
missing rules).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from cluster import realnode, realnode_registry
from cluster.components import Layout
from cluster.controlplane import Cluster, tool
from cluster.realnode_net import direct_environment

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "trainwave"
RELEASE = "trainwave"
NAMESPACE = "trainwave-system"
SERVICE_ACCOUNT = "trainwave"
LEASE = "trainwave-leader"  # the chart's name for release "trainwave", the CLI's default


def install_chart(cluster: Cluster, *extra: str, chart: str = str(CHART)) -> None:
    """`helm upgrade --install` the chart (this tree's, unless `chart` names another, e.g.
    `publish_chart`'s): CRDs, RBAC, ServiceAccount, Deployment, with the chart's values plus
    `extra` (--reset-values: helm would otherwise keep the values an earlier upgrade set, and
    a reused cluster would carry them from test to test)."""
    result = helm(cluster, "upgrade", "--install", RELEASE, chart,
                   "--namespace", NAMESPACE, "--create-namespace", "--wait", "--timeout", "120s",
                   "--reset-values", *extra)  # fmt: skip
    if result.returncode != 0:
        raise RuntimeError(f"helm install failed: {result.stderr.strip()}")
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s",
                    "crd/trainingjobs.trainwave.io")  # fmt: skip


def publish_chart(cluster: Cluster) -> tuple[str, list[str]]:
    """`helm package` this tree's chart and `helm push` it to the cluster's registry as an
    OCI artifact, as a project publishes a release. Returns the chart's reference
    (`oci://<registry>/charts/trainwave`) and the flags `helm install` needs to pull it (its
    version, the registry's CA and credentials)."""
    workdir = cluster.state_dir / "chart"
    workdir.mkdir(exist_ok=True)
    for old in workdir.glob("*.tgz"):
        old.unlink()
    packaged = helm(cluster, "package", str(CHART), "--destination", str(workdir))
    if packaged.returncode != 0:
        raise RuntimeError(f"helm package failed: {packaged.stderr.strip()}")
    (archive,) = workdir.glob("*.tgz")
    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["version"]
    registry = realnode_registry.files(cluster.state_dir)
    user, password = realnode_registry.credentials(registry)
    access = ["--ca-file", str(Layout(cluster.state_dir).pki.ca_cert),
              "--username", user, "--password", password]  # fmt: skip
    repository = f"oci://{realnode_registry.HOST}/charts"
    pushed = helm(cluster, "push", str(archive), repository, *access)
    if pushed.returncode != 0:
        raise RuntimeError(f"helm push failed: {pushed.stderr.strip()}")
    return f"{repository}/{CHART.name}", ["--version", str(version), *access]


def helm(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    """The pinned helm against this cluster; its registry logins and pulled charts under
    the cluster's state dir, not the user's home."""
    environment = direct_environment() | {"KUBECONFIG": str(cluster.kubeconfig)}
    home = cluster.state_dir / "helm"
    state = ["--registry-config", str(home / "registry.json"),
             "--content-cache", str(home / "content")]  # fmt: skip
    return subprocess.run(
        [str(tool("helm")), *args, *state],
        check=False, env=environment, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


# The release's `imagePullSecrets` when it installs from the cluster's registry.
PULL_SECRET = "trainwave-registry"
# `make demo` keeps the real node for trainwave's own pods, as a system node pool; the e2e
# tier, whose workers run there, removes it (`untaint_system_node`).
SYSTEM_TAINT = {"key": "trainwave.io/system", "value": "true", "effect": "NoSchedule"}


def taint_system_node(cluster: Cluster, node: str) -> None:
    taint = f"{SYSTEM_TAINT['key']}={SYSTEM_TAINT['value']}:{SYSTEM_TAINT['effect']}"
    cluster.kubectl("taint", "node", node, taint, "--overwrite")


def untaint_system_node(cluster: Cluster, node: str) -> None:
    taint = f"{SYSTEM_TAINT['key']}:{SYSTEM_TAINT['effect']}-"
    cluster.kubectl("taint", "node", node, taint, check=False)  # absent: nothing to do


def registry_values() -> dict[str, Any]:
    """Chart values that pull the operator and agent images from the cluster's registry
    (realnode_registry.py), as a user installs: the registry host prefixed to the chart's
    repositories and a pull secret. `Always`: a rebuilt image keeps its tag."""
    host = realnode_registry.HOST
    return {
        "image": {"repository": f"{host}/trainwave/operator", "pullPolicy": "Always"},
        "imagePullSecrets": [{"name": PULL_SECRET}],
        "agent": {"image": {"repository": f"{host}/trainwave/agent", "pullPolicy": "Always"}},
    }


def apply_pull_secret(cluster: Cluster, namespace: str = NAMESPACE) -> None:
    """The registry's credentials as `PULL_SECRET` in `namespace` (created if missing)."""
    cluster.kubectl("create", "namespace", namespace, check=False)
    registry = realnode_registry.files(cluster.state_dir)
    secret = realnode_registry.pull_secret(registry, PULL_SECRET, namespace)
    cluster.kubectl("apply", "-f", "-", input=json.dumps(secret))


def restart_stale_pods(cluster: Cluster) -> None:
    """On a cluster kept from an earlier run, `make images` may have rebuilt an image under
    the same tag since the release's pods started: helm sees no change, so restart the
    workloads whose pods run an image other than the one last pushed to the registry under
    that tag (pulled `Always`, the new pods get it) or, for an image not pulled, one their
    node's containerd no longer names."""
    layouts = realnode.node_layouts(Layout(cluster.state_dir), len(cluster.real_nodes))
    sockets = {layout.name: layout.containerd_socket for layout in layouts}
    registry = realnode_registry.files(cluster.state_dir)
    pods = json.loads(cluster.kubectl("get", "pods", "-n", NAMESPACE, "-o", "json").stdout)
    stale = set()
    for pod in pods["items"]:
        owner = pod["metadata"].get("labels", {}).get("app.kubernetes.io/component")
        socket = sockets.get(pod["spec"].get("nodeName", ""))
        for status in pod.get("status", {}).get("containerStatuses") or []:
            running = str(status.get("imageID") or "")
            pushed = realnode_registry.pushed_digest(registry, status["image"])
            if pushed:
                moved = not running.endswith(pushed)
            else:
                moved = bool(
                    socket and running and running not in image_ids(socket, status["image"])
                )
            if moved:
                stale.add(
                    f"daemonset/{RELEASE}-agent" if owner == "agent" else f"deployment/{RELEASE}"
                )
    for workload in sorted(stale):
        cluster.kubectl("rollout", "restart", workload, "-n", NAMESPACE)
        cluster.kubectl("rollout", "status", workload, "-n", NAMESPACE, "--timeout=120s",
                        timeout=130)  # fmt: skip


def wait_rolled_out(cluster: Cluster) -> None:
    """The operator's Deployment and the agent's DaemonSet rolled out: their workloads, not
    their pods by label, since after a change of values the old pods are still terminating
    and never become Ready."""
    for workload in (f"deployment/{RELEASE}", f"daemonset/{RELEASE}-agent"):
        cluster.kubectl("rollout", "status", workload, "-n", NAMESPACE,
                        "--timeout=180s", timeout=190)  # fmt: skip


def image_ids(socket: Path, ref: str) -> set[str]:
    """The ids a node's containerd (`socket`) knows image `ref` by (config id, repo digests)."""
    endpoint = f"unix://{socket}"
    found = subprocess.run(
        [str(tool("crictl")), f"--image-endpoint={endpoint}", f"--runtime-endpoint={endpoint}",
         "inspecti", "-o", "json", ref],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    if found.returncode != 0:
        return set()
    status = json.loads(found.stdout)["status"]
    return {status["id"], *status.get("repoDigests", [])}


def service_account_kubeconfig(
    cluster: Cluster,
    path: Path,
    hours: int = 24,
    *,
    account: str = SERVICE_ACCOUNT,
    namespace: str = NAMESPACE,
    bound_pod: str | None = None,
) -> Path:
    """A kubeconfig that authenticates as a ServiceAccount (TokenRequest); the operator's
    by default, the agent's (`<release>-agent`) or any other by name. With `bound_pod`
    the token is bound to that pod of `namespace`, as the kubelet's projected tokens are:
    it dies with the pod and carries the pod's node (`authentication.kubernetes.io/
    node-name` in the user's extra), which the agent's admission policy checks."""
    binding = ("--bound-object-kind", "Pod", "--bound-object-name", bound_pod) if bound_pod else ()
    token = cluster.kubectl(
        "create", "token", account, "-n", namespace, f"--duration={hours}h", *binding
    ).stdout.strip()
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    cluster_entry = admin["clusters"][0]
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": cluster_entry["cluster"]}],
        "users": [{"name": account, "user": {"token": token}}],
        "contexts": [{"name": account, "context": {"cluster": "local", "user": account}}],
        "current-context": account,
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# Starts of a local operator, each on newly picked ports after a port was taken.
PORT_ATTEMPTS = 3


@dataclass
class OperatorProcess:
    """`trainwave operator` on this machine, as the chart's ServiceAccount."""

    kubeconfig: Path
    log_path: Path
    metrics_port: int = field(default_factory=free_port)
    health_port: int = field(default_factory=free_port)
    extra_args: tuple[str, ...] = ()  # more `trainwave operator` flags, e.g. ("--workers", "8")
    # The pod this process stands in for: its leader identity is `<pod_name>_<random>`, and a
    # restart keeps the name, as a container restart inside one pod does. The test process's
    # pid in it keeps two test sessions on one cluster from taking each other's Lease as
    # their own pod's (they would fight over it; two pods never share a name).
    pod_name: str = field(default_factory=lambda: f"trainwave-local-{os.getpid()}")
    process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60) -> None:
        """Start the operator and wait until it is healthy. Its ports were free when picked,
        not necessarily now: a restart reuses them, and another process on the machine may
        have taken one meanwhile (seen once in CI). Then it starts again on new ones."""
        for _ in range(PORT_ATTEMPTS - 1):
            try:
                return self._start(timeout)
            except RuntimeError as error:
                if "address already in use" not in str(error):
                    raise
            self.metrics_port, self.health_port = free_port(), free_port()
        self._start(timeout)

    def _start(self, timeout: float) -> None:
        # This checkout's operator, not whichever one the venv's editable install points at:
        # in a git worktree those differ, and tests would exercise the other code.
        path = os.pathsep.join(filter(None, [str(REPO / "operator"), os.environ.get("PYTHONPATH")]))
        environment = os.environ | {
            "KUBECONFIG": str(self.kubeconfig),
            "PYTHONPATH": path,
            # What the chart's downward API gives the operator: the Lease's namespace and
            # the identity's prefix.
            "POD_NAMESPACE": NAMESPACE,
            "POD_NAME": self.pod_name,
        }
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "trainwave.cli", "operator",
             "--metrics-port", str(self.metrics_port), "--health-port", str(self.health_port),
             "--health-host", "127.0.0.1",
             # Simulated pods get addresses that lead nowhere; only the test
             # kubelet's pods (loopback) have a runtime to read.
             "--status-networks", "127.0.0.0/8", *self.extra_args],
            env=environment, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + timeout
        while not self.healthy():
            if self.process.poll() is not None:
                raise RuntimeError(f"operator exited with {self.process.returncode}: {self.tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"operator not healthy after {timeout}s: {self.tail()}")
            time.sleep(0.2)

    def healthy(self) -> bool:
        return _http_ok(f"http://127.0.0.1:{self.health_port}/healthz")

    def metrics(self) -> str:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            return str(response.read().decode())

    def kill(self) -> None:
        """SIGKILL: no cleanup, no goodbye, exactly like a node or OOM kill."""
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False
