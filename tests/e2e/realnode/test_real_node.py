"""The real node of tests/cluster: Ready, runs a pod from a local image, serves logs and
exec through the API server, resolves cluster DNS, reaches the API server through the
`kubernetes` Service, and `down` leaves nothing behind on the host.

The pod image is the trainwave Python base from `make images` (it has python3 for the
checks below); the tests fail, not skip, when it or any other part is missing.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster import processes, realnode_registry
from cluster import realnode_host as host
from cluster.controlplane import Cluster
from cluster.realnode_config import CLUSTER_DNS_IP, KUBELET_ROOT
from cluster.realnode_net import BRIDGE, KUBELET_SYSCTLS, NETNS_DIR, NodeNetwork, read_sysctls
from e2e.realnode.conftest import python_image
from integration.conftest import namespace_name

pytestmark = pytest.mark.timeout(300)

NODE = "tw-real-1"
NETWORK = NodeNetwork(1)
POD = "probe-0"
HEADLESS = "probes"
SERVICE = "probe-service"
SERVER_PORT = 8080
# Runs in the pod: prints a line (for `kubectl logs`), then serves HTTP on 8080 (for the
# host-to-pod route check) until it is deleted.
SERVE = (
    "import http.server, sys; print('hello from the real node', flush=True); "
    f"http.server.HTTPServer(('', {SERVER_PORT}), http.server.SimpleHTTPRequestHandler)"
    ".serve_forever()"
)


@pytest.fixture(scope="module")
def probe(cluster: Cluster) -> Iterator[tuple[str, str]]:
    """A pod on the real node behind a headless Service; yields (namespace, pod IP)."""
    namespace = namespace_name("real-node-probe")
    cluster.kubectl("create", "namespace", namespace)
    cluster.kubectl(
        "wait", "--for=create", "serviceaccount/default", "-n", namespace, "--timeout=30s"
    )
    manifests = [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": HEADLESS, "namespace": namespace},
            "spec": {"clusterIP": "None", "selector": {"app": "probe"},
                     "ports": [{"port": SERVER_PORT}]},
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": SERVICE, "namespace": namespace},
            "spec": {"selector": {"app": "probe"}, "ports": [{"port": SERVER_PORT}]},
        },
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": POD, "namespace": namespace, "labels": {"app": "probe"}},
            "spec": {
                "nodeSelector": {"type": "real"},
                "hostname": POD,
                "subdomain": HEADLESS,
                "terminationGracePeriodSeconds": 1,
                "containers": [{
                    "name": "probe",
                    "image": python_image(),
                    "imagePullPolicy": "Never",
                    "command": ["python3", "-c", SERVE],
                    "ports": [{"containerPort": SERVER_PORT}],
                    "readinessProbe": {"tcpSocket": {"port": SERVER_PORT}, "periodSeconds": 1},
                }],
            },
        },
    ]  # fmt: skip
    cluster.kubectl("apply", "-f", "-", input="\n---\n".join(json.dumps(m) for m in manifests))
    cluster.kubectl(
        "wait", "--for=condition=Ready", f"pod/{POD}", "-n", namespace, "--timeout=90s",
        timeout=100,
    )  # fmt: skip
    pod = json.loads(cluster.kubectl("get", "pod", POD, "-n", namespace, "-o", "json").stdout)
    assert pod["spec"]["nodeName"] == NODE
    yield namespace, pod["status"]["podIP"]
    cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def in_pod(cluster: Cluster, namespace: str, code: str) -> str:
    result = cluster.kubectl("exec", POD, "-n", namespace, "--", "python3", "-c", code, check=False)
    assert result.returncode == 0, f"exec failed: {result.stderr}"
    return result.stdout.strip()


def test_real_node_is_ready_with_topology_labels_and_gpus(cluster: Cluster) -> None:
    node = json.loads(cluster.kubectl("get", "node", NODE, "-o", "json").stdout)
    conditions = {c["type"]: c["status"] for c in node["status"]["conditions"]}
    assert conditions["Ready"] == "True"
    labels = node["metadata"]["labels"]
    assert labels["type"] == "real"
    assert labels["trainwave.io/spine"]
    assert labels["trainwave.io/rack"]
    assert node["status"]["capacity"]["nvidia.com/gpu"] == "8"
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    addresses = {a["type"]: a["address"] for a in node["status"]["addresses"]}
    assert addresses["InternalIP"] == NETWORK.node_ip


def test_pod_logs_and_exec_go_through_the_kubelet(cluster: Cluster, probe: tuple[str, str]) -> None:
    namespace, pod_ip = probe
    logs = cluster.kubectl("logs", POD, "-n", namespace).stdout
    assert "hello from the real node" in logs
    assert in_pod(cluster, namespace, "import socket; print(socket.gethostname())") == POD
    assert pod_ip.startswith("10.245.1.")


def test_host_reaches_the_pod_ip(probe: tuple[str, str]) -> None:
    _, pod_ip = probe
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"http://{pod_ip}:{SERVER_PORT}/", timeout=5) as response:
        assert response.status == 200


def test_cluster_dns_resolves_services_and_headless_pod_names(
    cluster: Cluster, probe: tuple[str, str]
) -> None:
    namespace, pod_ip = probe
    resolv = in_pod(cluster, namespace, "print(open('/etc/resolv.conf').read())")
    assert f"nameserver {CLUSTER_DNS_IP}" in resolv
    lookup = "import socket, sys; print(socket.gethostbyname(sys.argv[1]))"
    kubernetes = in_pod(
        cluster, namespace, lookup.replace("sys.argv[1]", "'kubernetes.default.svc.cluster.local'")
    )
    assert kubernetes == "10.96.0.1"
    own = f"{POD}.{HEADLESS}.{namespace}.svc.cluster.local"
    assert in_pod(cluster, namespace, lookup.replace("sys.argv[1]", repr(own))) == pod_ip
    # The short form a worker uses for rank 0, through the pod's search domains.
    assert (
        in_pod(cluster, namespace, lookup.replace("sys.argv[1]", repr(f"{POD}.{HEADLESS}")))
        == pod_ip
    )


def test_pod_reaches_itself_through_its_service(cluster: Cluster, probe: tuple[str, str]) -> None:
    """Hairpin: the Service's ClusterIP is DNAT-ed back to the calling pod, on the
    same bridge port (hairpinMode plus bridged traffic through iptables in the node)."""
    namespace, _ = probe
    code = (
        "import urllib.request\n"
        f"url = 'http://{SERVICE}:{SERVER_PORT}/'\n"
        "print(urllib.request.urlopen(url, timeout=5).status)\n"
    )
    assert in_pod(cluster, namespace, code) == "200"


def test_pod_reaches_the_api_server_through_the_kubernetes_service(
    cluster: Cluster, probe: tuple[str, str]
) -> None:
    """What in-cluster config does: KUBERNETES_SERVICE_HOST, the token and the CA."""
    namespace, _ = probe
    code = (
        "import os, ssl, urllib.request\n"
        "sa = '/var/run/secrets/kubernetes.io/serviceaccount/'\n"
        "url = 'https://%s:%s/api' % (os.environ['KUBERNETES_SERVICE_HOST'],"
        " os.environ['KUBERNETES_SERVICE_PORT'])\n"
        "request = urllib.request.Request(url, headers={'Authorization': 'Bearer '"
        " + open(sa + 'token').read()})\n"
        "context = ssl.create_default_context(cafile=sa + 'ca.crt')\n"
        "print(urllib.request.urlopen(request, context=context, timeout=5).status)\n"
        "context.check_hostname = True\n"
        "url = 'https://kubernetes.default.svc/version'\n"
        "print(urllib.request.urlopen(url, context=context, timeout=5).status)\n"
    )
    assert in_pod(cluster, namespace, code).split() == ["200", "200"]


def test_service_rules_stay_in_the_node_namespace(probe: tuple[str, str]) -> None:
    """kube-proxy and CNI write iptables rules in the node's namespace, none on the host."""

    def rules(*prefix: str) -> str:
        command = [*prefix, "iptables-save"]
        return subprocess.run(command, capture_output=True, text=True, check=True).stdout

    assert "KUBE-SERVICES" in rules("ip", "netns", "exec", NETWORK.netns)
    host_rules = rules()
    assert "KUBE-" not in host_rules
    assert "CNI-" not in host_rules


def test_down_leaves_nothing_on_the_host(three_nodes: Cluster) -> None:
    """Last of all e2e tests: stops the session's cluster, by then with three real nodes
    (conftest.py), and checks the host."""
    cluster = three_nodes
    state = json.loads((cluster.state_dir / "state.json").read_text())
    saved = state["real_nodes"]["sysctls"]
    assert set(saved) == {n for n in KUBELET_SYSCTLS if Path("/proc/sys", n).exists()}
    networks = [NodeNetwork(index) for index in range(1, state["real_nodes"]["count"] + 1)]
    assert len(networks) == 3
    (registry,) = (p["pid"] for p in state["processes"] if p["name"] == realnode_registry.PROCESS)
    began = time.monotonic()
    cluster.stop()
    elapsed = time.monotonic() - began
    assert read_sysctls() == saved
    assert not processes.is_alive(registry)
    assert not KUBELET_ROOT.exists()
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    assert BRIDGE not in links
    for network in networks:
        assert not (NETNS_DIR / network.netns).exists()
        assert network.host_veth not in links
        # The node's cgroup root and the kubepods tree under it.
        assert not list(host.CGROUP_ROOT.glob(f"*/{network.netns}"))
        # containerd's root outlives the cluster (images stay imported), its mounts do not.
        containerd_root = host.cache_dir() / f"realnode-{network.index}-containerd"
        assert host.mounts_under(containerd_root) == []
    routes = subprocess.run(["ip", "route"], capture_output=True, text=True, check=True).stdout
    assert "10.245." not in routes
    assert host.kubepods_cgroups() == []
    # The second node's mount namespace was kept by a mount under the cluster dir.
    assert host.mounts_under(cluster.state_dir) == []
    assert not cluster.state_dir.exists()
    for path in state["real_nodes"]["created_paths"]:
        assert not Path(path).exists(), f"{path} was created by the real node and is still there"
    assert elapsed < 30, f"down took {elapsed:.1f}s"
