"""Fixtures of the e2e tier: trainwave installed by `helm install` onto a real node.

The local cluster (tests/cluster) runs with one real node, `tw-real-1` (a kubelet,
containerd and runc in a network namespace of their own, CoreDNS, kube-proxy) beside
the kwok nodes. The images from `make images` are pushed to the cluster's private registry
(TLS, credentials; tests/cluster/realnode_registry.py) and also imported into the node's
containerd. The chart is installed FOR REAL: the operator's Deployment (2 replicas, leader
election, the chart's security context: read-only root, user 65532, probes) and the agent's
DaemonSet run as containers on the real node, their images pulled from that registry with
the release's `imagePullSecrets`. Only the image repositories (the registry host
prefixed), their pull policy, the pull secret and the node selection differ from the
chart's defaults, plus what a cluster without a GPU needs: the agent
reads a fake-GPU file (`agent.fakeGpus`, format in operator/trainwave/agent/fake_gpus.py)
instead of NVML, with no NVIDIA runtime class. There is no GPU on this machine; the fake
file stands in, so nothing here verifies NVML, a GPU or an RDMA NIC.

ONE install serves every e2e test (a session fixture). The API for tests:

- `cluster` (session): the `Cluster` with `real_nodes=("tw-real-1",)`.
- `release` (session): a `Release` (below): the installed chart, once both operator
  pods and the agent pod are Ready. `release.cluster`, `release.node` (the real node's
  name), `release.fake_gpus` (the fake-GPU document the agent reads; GPUs 0 and 1 are
  offered for sharing, `SHARED_GPUS`), `release.values` (what `helm install` was given),
  `release.operator_pods()`, `release.leader()`, `release.agent_pod()`,
  `release.crictl(...)` (against the node's containerd), `release.container_id(...)`.
  The agent runs with `agent.gpuClaims: true` (its DRA kubelet plugin) and the arbiter.
- `namespace` (per test): a fresh namespace, deleted after the test.
- `ON_REAL_NODE`: the nodeSelector that pins a pod to the real node; `WORKER_IMAGE`:
  the Debian bookworm Python 3.11 base from `make images`, the worker image.

Real nodes need root, iproute2, unshare/nsenter and the parts from `make tools` and
`make images`. Without them the fixtures raise and every test here errors: CI must see
a missing prerequisite, not a skip. Only one real node can exist on a machine at a time:
run this tier under `flock /tmp/realnode.lock` when others might start one too.
Run e2e in a pytest session of its own (`make e2e`): the integration tier's fixtures
would start a second operator as a host process.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from cluster import realnode
from cluster.components import Layout
from cluster.controlplane import DEFAULT_TOPOLOGY, Cluster, ensure_cluster, tool
from cluster.deploy import (
    LEASE,
    NAMESPACE,
    apply_pull_secret,
    install_chart,
    publish_chart,
    registry_values,
    restart_stale_pods,
    untaint_system_node,
    wait_rolled_out,
)
from cluster.realnode_config import REAL_NODE_TYPE
from cluster.topology import KWOK_NODE_TYPE_LABEL
from integration.conftest import namespace

__all__ = ["cluster", "namespace", "release"]

REPO = Path(__file__).resolve().parents[2]
ON_REAL_NODE = {KWOK_NODE_TYPE_LABEL: REAL_NODE_TYPE}
WORKER_IMAGE = "trainwave/python:3.11-bookworm"
# The chart's default runtime image (appVersion 0.1.0). The operator and agent are pulled
# from the cluster's registry (`chart_values`); the runtime and worker images are preloaded
# into the node's containerd, so a test's job pulls nothing unless it asks.
RUNTIME_IMAGE = "trainwave/runtime:0.1.0"
OPERATOR_PODS = "app.kubernetes.io/instance=trainwave,app.kubernetes.io/component=operator"
AGENT_PODS = "app.kubernetes.io/instance=trainwave,app.kubernetes.io/component=agent"
# Pod Security level of the release namespace, as docs/operations/install.md asks: the
# agent mounts the host's /sys and /proc (hostPath), which only `privileged` allows.
RELEASE_NAMESPACE_LEVEL = "privileged"
SHARED_GPUS = "0,1"
# Eight fake GPUs of another model than the kwok nodes' H100s, so the labels the agent
# writes are told apart from the ones the node registered with.
FAKE_GPU_PRODUCT = "NVIDIA A100-SXM4-40GB"
FAKE_GPUS: dict[str, Any] = {
    "gpus": [
        {
            "uuid": f"GPU-e2e00000-0000-4000-8000-00000000000{index}",
            "name": FAKE_GPU_PRODUCT,
            "memoryMiB": 40960,
            "pciBusId": f"00000000:{0x10 + index:02X}:00.0",
        }
        for index in range(8)
    ],
    "nvlinks": [[0, 1], [2, 3], [4, 5], [6, 7]],
}


@dataclass(frozen=True)
class Release:
    """The chart as `helm install` left it on the cluster with the real node."""

    cluster: Cluster
    node: str
    containerd_socket: Path
    fake_gpus: dict[str, Any]
    values: dict[str, Any]
    # The chart as published to the cluster's registry, and what `helm` needs to pull it.
    chart: str
    pull: tuple[str, ...]
    namespace: str = NAMESPACE
    lease: str = LEASE
    crictl_path: Path = field(default_factory=lambda: tool("crictl"))

    def upgrade(self, values: dict[str, Any], name: str) -> None:
        """`helm upgrade` of the published chart with `values` (all of them: the rest are
        reset; written to `name` beside the release's own values), then wait until the
        operator's Deployment and the agent's DaemonSet have rolled out and an operator pod
        of the new revision leads."""
        path = self.cluster.state_dir / "e2e" / name
        path.write_text(yaml.safe_dump(values))
        install_chart(self.cluster, "-f", str(path), *self.pull, chart=self.chart)
        wait_rolled_out(self.cluster)
        self.wait_for_leader()

    def wait_for_leader(self) -> None:
        """Until one of the current operator pods holds the Lease: after a rollout the old
        leader released it on SIGTERM, and a new pod takes it within a retry period."""
        deadline = time.monotonic() + 60
        while True:
            names = [pod["metadata"]["name"] for pod in self.operator_pods()]
            if any(self.leader().startswith(f"{name}_") for name in names):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"none of {names} took the leader Lease within 60 s")
            time.sleep(0.5)

    def pods(self, selector: str) -> list[dict[str, Any]]:
        found = self.cluster.kubectl("get", "pods", "-n", self.namespace, "-l", selector,
                                     "-o", "json").stdout  # fmt: skip
        items: list[dict[str, Any]] = json.loads(found)["items"]
        return [p for p in items if not p["metadata"].get("deletionTimestamp")]

    def operator_pods(self) -> list[dict[str, Any]]:
        return self.pods(OPERATOR_PODS)

    def agent_pod(self) -> dict[str, Any]:
        (pod,) = self.pods(AGENT_PODS)
        return pod

    def leader(self) -> str:
        """The Lease's holderIdentity ('' when none holds it): `<pod name>_<random>`."""
        return self.cluster.kubectl(
            "get", "lease", self.lease, "-n", self.namespace,
            "-o", "jsonpath={.spec.holderIdentity}", check=False,
        ).stdout.strip()  # fmt: skip

    def crictl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """crictl against the real node's containerd (the kubelet's CRI endpoint)."""
        endpoint = f"unix://{self.containerd_socket}"
        return subprocess.run(
            [str(self.crictl_path), f"--runtime-endpoint={endpoint}",
             f"--image-endpoint={endpoint}", *args],
            capture_output=True, text=True, check=check, timeout=60,
        )  # fmt: skip

    def container_id(self, namespace: str, pod: str, container: str) -> str:
        """The running container `container` of `pod`, as containerd knows it."""
        found = self.crictl(
            "ps", "--quiet", "--state", "Running", "--name", f"^{container}$",
            "--label", f"io.kubernetes.pod.namespace={namespace}",
            "--label", f"io.kubernetes.pod.name={pod}",
        ).stdout.split()  # fmt: skip
        assert len(found) == 1, f"running {container} containers of {namespace}/{pod}: {found}"
        return found[0]

    def container_info(self, namespace: str, pod: str, container: str) -> dict[str, Any]:
        """containerd's view of that running container (`crictl inspect`'s "info": its pid,
        the CRI request's config, the OCI runtime spec)."""
        found = self.crictl("inspect", self.container_id(namespace, pod, container)).stdout
        info: dict[str, Any] = json.loads(found)["info"]
        return info


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each e2e test's timeout covers the test, not the session's fixtures: starting the
    cluster with its real node and installing the chart (minutes, cold) would otherwise
    count against whichever test comes first. Those fixtures have timeouts of their own."""
    here = Path(__file__).parent
    for item in items:
        if here not in Path(item.path).parents:
            continue
        marker = item.get_closest_marker("timeout")
        args = marker.args if marker else (item.config.getini("timeout"),)
        kwargs = marker.kwargs if marker else {}
        if "func_only" not in kwargs:
            item.add_marker(pytest.mark.timeout(*args, **kwargs, func_only=True), append=False)


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    """The local control plane with one real node; stopped at the end if this session
    started it (unless TRAINWAVE_KEEP_CLUSTER=1)."""
    running = ensure_cluster(DEFAULT_TOPOLOGY, real_nodes=1, timeout=300)
    yield running
    if running.started and os.environ.get("TRAINWAVE_KEEP_CLUSTER") != "1":
        running.stop()


@pytest.fixture(scope="session")
def release(cluster: Cluster) -> Release:
    """`helm install` of the chart onto the real node; returns once both operator pods
    and the agent pod are Ready and one operator holds the leader Lease."""
    return install_release(cluster)


def install_release(cluster: Cluster) -> Release:
    """The `release` fixture's work, for benchmarks that run outside pytest too."""
    node = cluster.real_nodes[0]
    layouts = realnode.node_layouts(Layout(cluster.state_dir), len(cluster.real_nodes))
    sockets = {layout.name: layout.containerd_socket for layout in layouts}
    for socket in sockets.values():
        missing_images(socket)
    directory = cluster.state_dir / "e2e"
    directory.mkdir(exist_ok=True)
    fake_gpus = directory / "fake-gpus.json"
    fake_gpus.write_text(json.dumps(FAKE_GPUS, indent=2))
    values = chart_values(fake_gpus)
    values_file = directory / "values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    cluster.kubectl("create", "namespace", NAMESPACE, check=False)
    cluster.kubectl("label", "namespace", NAMESPACE, "--overwrite",
                    f"pod-security.kubernetes.io/enforce={RELEASE_NAMESPACE_LEVEL}")  # fmt: skip
    apply_pull_secret(cluster)
    for name in cluster.real_nodes:  # a cluster `make demo` left: its workers run there
        untaint_system_node(cluster, name)
    began = time.monotonic()
    try:
        chart, pull = publish_chart(cluster)  # `helm install oci://...`, as from a release
        install_chart(cluster, "-f", str(values_file), *pull, chart=chart)
        restart_stale_pods(cluster)
        wait_rolled_out(cluster)
    except (RuntimeError, subprocess.CalledProcessError) as error:
        raise RuntimeError(f"{error}\n{release_diagnostics(cluster)}") from error
    installed = Release(cluster, node, sockets[node], FAKE_GPUS, values, chart, tuple(pull))
    installed.wait_for_leader()
    print(f"trainwave installed on {node} in {time.monotonic() - began:.1f}s")
    return installed


def release_diagnostics(cluster: Cluster) -> str:
    """Why the release is not Ready: its pods, their events and their containers' output."""
    parts = []
    for args in (
        ("get", "pods", "-n", NAMESPACE, "-o", "wide"),
        ("describe", "pods", "-n", NAMESPACE),
        ("logs", "-n", NAMESPACE, "-l", OPERATOR_PODS, "--all-containers", "--tail=30"),
        ("logs", "-n", NAMESPACE, "-l", AGENT_PODS, "--all-containers", "--tail=30"),
    ):
        result = cluster.kubectl(*args, check=False)
        parts.append(f"$ kubectl {' '.join(args)}\n{result.stdout[-6000:]}{result.stderr[-2000:]}")
    return "\n".join(parts)


def chart_values(fake_gpus: Path) -> dict[str, Any]:
    """What this tier changes from the chart's defaults (and why)."""
    pulled = registry_values()  # from the cluster's private registry, as a user installs
    return {
        **pulled,
        "nodeSelector": ON_REAL_NODE,  # kwok nodes only pretend to run pods
        "replicas": 2,
        "leaderElection": {"enabled": True},
        "agent": {
            "enabled": True,
            **pulled["agent"],
            # Not `nvidia.com/gpu.present`: GPU feature discovery never ran here.
            "nodeSelector": {"nvidia.com/gpu.present": None, **ON_REAL_NODE},
            # No GPU and no NVIDIA container runtime on this machine: the fake file instead.
            "fakeGpus": str(fake_gpus),
            "runtimeClassName": "",
            "nvidiaVisibleDevices": "",
            "sharedGpus": SHARED_GPUS,
            "gpuClaims": True,
            "arbiter": {"enabled": True},
        },
    }


def missing_images(socket: Path) -> None:
    """Fail naming the preloaded images `make images` has not put into the node's
    containerd (the release's own are pulled from the registry)."""
    listed = subprocess.run(
        [str(tool("ctr")), f"--address={socket}", "--namespace=k8s.io", "images", "list", "-q"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout.split()  # fmt: skip
    wanted = [RUNTIME_IMAGE, WORKER_IMAGE]
    absent = [ref for ref in wanted if f"docker.io/{ref}" not in listed and ref not in listed]
    if absent:
        raise RuntimeError(
            f"the real node's containerd lacks {absent} (it has {listed}); run `make images`, "
            "then start the cluster again (`python -m cluster up --real-nodes 1` imports them)"
        )
