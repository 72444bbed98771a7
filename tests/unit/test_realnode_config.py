"""The real node's settings (tests/cluster/realnode_config.py), checked without starting
anything: what keeps traffic on the machine, containerd's sockets off the host's paths,
and the API server unchanged when there are no real nodes."""

from __future__ import annotations

import base64
import ipaddress
import json
import tomllib
from pathlib import Path

from cluster import components, realnode_mounts, realnode_registry
from cluster import realnode_host as host
from cluster.components import Layout, Ports
from cluster.realnode import node_labels
from cluster.realnode_config import (
    CDI_SPEC_DIRS,
    NodeLayout,
    cni_config,
    containerd_config,
    kubelet_config,
    proxy_config,
)
from cluster.realnode_net import BRIDGE_IP, NodeNetwork, nsenter_prefix
from cluster.topology import load_topology

SMALL = Path(__file__).resolve().parents[1] / "cluster" / "topologies" / "small.yaml"


def node(tmp_path: Path) -> NodeLayout:
    return NodeLayout(tmp_path / "realnode-1", NodeNetwork(1), tmp_path / "containerd-root")


def test_pods_get_no_default_route_and_no_masquerading(tmp_path: Path) -> None:
    plugin = cni_config(node(tmp_path))["plugins"][0]
    assert plugin["ipMasq"] is False
    routes = [ipaddress.ip_network(route["dst"]) for route in plugin["ipam"]["routes"]]
    assert ipaddress.ip_network("0.0.0.0/0") not in routes
    # Nothing routed to pods is public: the Service range, the bridge, the pod ranges.
    assert all(route.is_private for route in routes)
    subnet = ipaddress.ip_network(plugin["ipam"]["ranges"][0][0]["subnet"])
    assert not subnet.overlaps(ipaddress.ip_network(components.POD_CIDR))  # kwok's pods


def test_containerd_2_config_keeps_its_sockets_and_state_off_the_host_paths(
    tmp_path: Path,
) -> None:
    layout = node(tmp_path)
    document = tomllib.loads(
        containerd_config(
            layout,
            major_version=2,
            sandbox_image="localhost/trainwave/pause:3.10",
            runc=Path("/usr/sbin/runc"),
            cni_bin=tmp_path / "cni",
        )
    )
    plugins = document["plugins"]
    assert plugins["io.containerd.server.v1.grpc"]["address"] == str(layout.containerd_socket)
    socket_dir = plugins["io.containerd.shim.v1.manager"]["socket_dir"]
    assert len(socket_dir) <= 42, "containerd refuses longer shim socket dirs"
    assert not socket_dir.startswith("/run/containerd")
    runtime = plugins["io.containerd.cri.v1.runtime"]
    assert runtime["cdi_spec_dirs"] == list(CDI_SPEC_DIRS)
    assert runtime["restrict_oom_score_adj"] is True
    options = runtime["containerd"]["runtimes"]["runc"]["options"]
    assert options["SystemdCgroup"] is False
    assert options["Root"].startswith(str(layout.root))
    assert "io.containerd.internal.v1.opt" in document["disabled_plugins"]
    # Registry hosts from the node's own directory: the cluster's registry alone.
    images = plugins["io.containerd.cri.v1.images"]
    assert images["registry"]["config_path"] == str(layout.registry_hosts)


def test_containerd_trusts_the_cluster_ca_for_the_clusters_registry_alone(tmp_path: Path) -> None:
    ca = tmp_path / "ca.crt"
    realnode_registry.containerd_hosts(tmp_path / "certs.d", ca)
    (directory,) = (tmp_path / "certs.d").iterdir()
    assert directory.name == realnode_registry.HOST == f"{BRIDGE_IP}:5000"
    hosts = tomllib.loads((directory / "hosts.toml").read_text())
    assert hosts["server"] == f"https://{BRIDGE_IP}:5000"
    host_settings = hosts["host"][f"https://{BRIDGE_IP}:5000"]
    assert host_settings == {"capabilities": ["pull", "resolve"], "ca": str(ca)}


def test_registry_names_and_its_pull_secret(tmp_path: Path) -> None:
    assert realnode_registry.registry_ref("docker.io/trainwave/runtime:0.1.0") == (
        f"{BRIDGE_IP}:5000/trainwave/runtime:0.1.0"
    )
    assert realnode_registry.registry_ref("trainwave/agent:0.1.0") == (
        f"{BRIDGE_IP}:5000/trainwave/agent:0.1.0"
    )
    files = realnode_registry.RegistryFiles(tmp_path / "state", tmp_path / "storage")
    files.root.mkdir()
    files.password.write_text("s3cret\n")
    secret = realnode_registry.pull_secret(files, "pull", "team-a")
    assert secret["type"] == "kubernetes.io/dockerconfigjson"
    assert secret["metadata"] == {"name": "pull", "namespace": "team-a"}
    config = json.loads(base64.b64decode(secret["data"][".dockerconfigjson"]))
    auth = config["auths"][f"{BRIDGE_IP}:5000"]
    assert (auth["username"], auth["password"]) == ("trainwave", "s3cret")
    assert base64.b64decode(auth["auth"]) == b"trainwave:s3cret"
    # Nothing pushed yet: no digest; a pushed image's manifest digest otherwise.
    assert realnode_registry.pushed_digest(files, "x") == ""
    files.storage.mkdir()
    files.pushed.write_text(json.dumps({"r:1": {"key": "k", "digest": "sha256:ab"}}))
    assert realnode_registry.pushed_digest(files, "r:1") == "sha256:ab"


def test_real_node_labels_say_real_and_carry_the_topology() -> None:
    labels = node_labels(load_topology(SMALL))
    assert labels["type"] == "real"
    assert labels["trainwave.io/rack"] == "rack-real"
    assert not any("kubernetes.io/" in key for key in labels)  # the kubelet's own
    assert not any("rdma" in key for key in labels)  # no RDMA NIC here


def test_api_server_flags_change_only_with_real_nodes(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    ports = Ports(1, 2, 3, 4, 5, 6)
    plain = components.apiserver_command(Path("kube-apiserver"), layout, ports)
    assert "--bind-address=127.0.0.1" in plain
    assert not any("kubelet-client" in flag or BRIDGE_IP in flag for flag in plain)
    real = components.apiserver_command(Path("kube-apiserver"), layout, ports, node_host=BRIDGE_IP)
    assert real[: len(plain)] == plain
    # pflag keeps the last value of a repeated flag: these win over the loopback ones.
    assert real[len(plain) :][:3] == [
        f"--bind-address={BRIDGE_IP}",
        f"--advertise-address={BRIDGE_IP}",
        "--endpoint-reconciler-type=lease",
    ]


def test_only_further_nodes_get_their_own_mount_namespace_and_cgroup_root(tmp_path: Path) -> None:
    first = node(tmp_path)
    second = NodeLayout(tmp_path / "realnode-2", NodeNetwork(2), tmp_path / "containerd-2")
    gates = {"DynamicResourceAllocation": True}
    # The first node keeps the host's paths and the kubelet's default cgroup root.
    assert "cgroupRoot" not in kubelet_config(first, tmp_path / "ca.crt", gates)
    assert realnode_mounts.namespace_of(first) is None
    assert nsenter_prefix(first.network) == ["nsenter", "--net=/run/netns/twnode-1", "--"]
    # A further one: its pods in /twnode-2/kubepods, its processes in its mount namespace.
    assert kubelet_config(second, tmp_path / "ca.crt", gates)["cgroupRoot"] == "/twnode-2"
    namespace = realnode_mounts.namespace_of(second)
    assert namespace is not None
    assert namespace.is_relative_to(second.root)
    prefix = nsenter_prefix(second.network, namespace)
    assert prefix[:2] == ["nsenter", "--net=/run/netns/twnode-2"]
    assert f"--mount={namespace}" in prefix
    # Every fixed path a kubelet or the chart's agent writes gets a directory of the node's.
    sources = {realnode_mounts.node_dir_for(second, p) for p in realnode_mounts.PRIVATE_PATHS}
    assert len(sources) == len(realnode_mounts.PRIVATE_PATHS)
    assert all(source.is_relative_to(second.root) for source in sources)
    assert {"/var/lib/kubelet", "/var/run/cdi"} <= set(realnode_mounts.PRIVATE_PATHS)


def test_service_traffic_from_any_nodes_pods_is_not_masqueraded(tmp_path: Path) -> None:
    second = NodeLayout(tmp_path / "realnode-2", NodeNetwork(2), tmp_path / "containerd-2")
    cidr = ipaddress.ip_network(proxy_config(second)["clusterCIDR"])
    for index in (1, 2, 3):
        assert ipaddress.ip_network(NodeNetwork(index).pod_subnet).subnet_of(cidr)


def test_only_image_ids_whose_tag_moved_on_are_stale() -> None:
    listing = "\n".join([
        "REF                         TYPE      DIGEST         SIZE  PLATFORMS  LABELS",
        "docker.io/trainwave/op:0.1  manifest  sha256:new     10    linux/amd64 -",
        "sha256:idnew                manifest  sha256:new     10    linux/amd64 -",
        "sha256:idold                manifest  sha256:old     10    linux/amd64 -",
        "localhost/trainwave/pause:3 manifest  sha256:pause   1     linux/amd64 -",
    ])  # fmt: skip
    assert host.stale_image_ids(listing) == ["sha256:idold"]
    assert host.stale_image_ids("REF TYPE DIGEST\n") == []
