"""More real nodes on one machine: each kubelet keeps to its own files and cgroups, and pods
on different nodes reach each other by their headless Service names.

Runs after every other e2e test but the test of `down` (realnode/conftest.py):
`three_nodes` restarts the session's cluster with three real nodes, and the test of `down`
then checks that every node leaves nothing behind. The checks use nodes 1 and 2.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cluster import realnode, realnode_mounts
from cluster import realnode_host as host
from cluster.components import Layout
from cluster.controlplane import Cluster
from cluster.realnode_config import KUBELET_ROOT
from e2e.realnode.conftest import python_image
from integration.conftest import namespace_name

pytestmark = pytest.mark.timeout(300)

HEADLESS = "peers"
PORT = 8080
SERVE = (
    "import http.server, socket; "
    f"http.server.HTTPServer(('', {PORT}), http.server.SimpleHTTPRequestHandler).serve_forever()"
)


def peer_pod(namespace: str, name: str, node: str) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": "peer"}},
        "spec": {
            "nodeName": node,
            "hostname": name,
            "subdomain": HEADLESS,
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "peer",
                "image": python_image(),
                "imagePullPolicy": "Never",
                "command": ["python3", "-c", SERVE],
                "readinessProbe": {"tcpSocket": {"port": PORT}, "periodSeconds": 1},
            }],
        },
    }  # fmt: skip


def test_second_node_keeps_to_its_own_files_and_cgroups_and_pods_talk_across(
    three_nodes: Cluster,
) -> None:
    cluster = three_nodes
    assert cluster.real_nodes == ("tw-real-1", "tw-real-2", "tw-real-3")
    namespace = namespace_name("two-nodes")
    cluster.kubectl("create", "namespace", namespace)
    cluster.kubectl(
        "wait", "--for=create", "serviceaccount/default", "-n", namespace, "--timeout=30s"
    )
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": HEADLESS, "namespace": namespace},
        "spec": {"clusterIP": "None", "selector": {"app": "peer"}, "ports": [{"port": PORT}]},
    }
    pods = {"one": "tw-real-1", "two": "tw-real-2"}
    manifests = [service, *(peer_pod(namespace, name, node) for name, node in pods.items())]
    cluster.kubectl("apply", "-f", "-", input="\n---\n".join(json.dumps(m) for m in manifests))
    for name in pods:
        cluster.kubectl("wait", "--for=condition=Ready", f"pod/{name}", "-n", namespace,
                        "--timeout=90s", timeout=100)  # fmt: skip
    found = {
        name: json.loads(cluster.kubectl("get", "pod", name, "-n", namespace, "-o", "json").stdout)
        for name in pods
    }
    assert found["two"]["status"]["podIP"].startswith("10.245.2.")

    # Each pod fetches from the other by the name a worker uses for rank 0.
    fetch = (
        "import urllib.request, sys; print(urllib.request.urlopen(sys.argv[1], timeout=5).status)"
    )
    for source, target in (("one", "two"), ("two", "one")):
        url = f"http://{target}.{HEADLESS}:{PORT}/"
        result = cluster.kubectl("exec", source, "-n", namespace, "--", "python3", "-c", fetch,
                                 url, check=False)  # fmt: skip
        assert result.stdout.strip() == "200", f"{source} -> {url}: {result.stderr}"

    # Node 2's pod lives under node 2's cgroup root and kubelet dir, not node 1's.
    uid = found["two"]["metadata"]["uid"]
    cgroups = host.kubepods_cgroups()
    homes = {path.parent.name for path in cgroups if any(path.rglob(f"pod{uid}"))}
    assert homes == {"twnode-2"}, f"pod{uid} found under {homes} of {cgroups}"
    assert not (KUBELET_ROOT / "pods" / uid).exists()
    (second,) = realnode.node_layouts(Layout(cluster.state_dir), 2)[1:]
    assert (realnode_mounts.node_dir_for(second, str(KUBELET_ROOT)) / "pods" / uid).is_dir()
    # The first node's pods stay in the host's kubelet dir, where tests read them.
    assert (KUBELET_ROOT / "pods" / found["one"]["metadata"]["uid"]).is_dir()
    cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def test_each_node_has_its_own_device_plugin_and_registration_dirs(three_nodes: Cluster) -> None:
    """The paths a kubelet hard-codes whatever its --root-dir: not shared between nodes."""
    (second,) = realnode.node_layouts(Layout(three_nodes.state_dir), 2)[1:]
    private_kubelet = realnode_mounts.node_dir_for(second, str(KUBELET_ROOT))
    for name in ("device-plugins", "plugins_registry"):
        own = private_kubelet / name
        assert own.is_dir(), f"{own}: node 2's kubelet did not create it"
        assert own.resolve() != (KUBELET_ROOT / name).resolve()
    sockets = {p.name for p in (private_kubelet / "device-plugins").iterdir()}
    assert "kubelet.sock" in sockets
    assert Path(KUBELET_ROOT / "device-plugins" / "kubelet.sock").exists()
