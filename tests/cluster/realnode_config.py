"""What a real node runs, and with which settings: containerd, kubelet, kube-proxy, CNI.

Pure: functions of a `NodeLayout` (where a node keeps its files) and the node's network;
realnode.py writes the files and starts the processes. The settings that matter on this
kind of machine (cgroup v1, root without CAP_SYS_RESOURCE, no route off the machine) are
explained where they are set; /work/shared/research/real-node.md has how they were found.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cluster.realnode_net import BRIDGE_IP, BRIDGE_PREFIX, POD_SUPERNET, NodeNetwork

# The kubelet's root dir is the standard one: the chart's agent mounts
# /var/lib/kubelet/plugins and plugins_registry by hostPath for its DRA plugin.
KUBELET_ROOT = Path("/var/lib/kubelet")
KUBELET_MARKER = KUBELET_ROOT / ".trainwave-cluster"
# Where the agent's kubelet plugin writes CDI specs (charts/trainwave agent-daemonset
# hostPath /var/run/cdi); containerd must read the same directory.
CDI_SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")
CLUSTER_DOMAIN = "cluster.local"
# The Service range's tenth address, as kubeadm and kind give kube-dns.
CLUSTER_DNS_IP = "10.96.0.10"
CNI_NETWORK = "trainwave"
REAL_NODE_TYPE = "real"


@dataclass(frozen=True)
class NodeLayout:
    """Where real node `network.index` keeps its files: under the cluster's state dir,
    except containerd's root (`image_root`), kept across clusters in the tools cache."""

    root: Path
    network: NodeNetwork
    image_root: Path

    @property
    def name(self) -> str:
        return f"tw-real-{self.network.index}"

    def path(self, *parts: str) -> Path:
        return self.root.joinpath(*parts)

    @property
    def containerd_config(self) -> Path:
        return self.path("containerd", "config.toml")

    @property
    def registry_hosts(self) -> Path:
        """containerd's `config_path`: one directory per registry host, with its hosts.toml."""
        return self.path("containerd", "certs.d")

    @property
    def containerd_socket(self) -> Path:
        return self.path("containerd", "containerd.sock")

    @property
    def containerd_root(self) -> Path:
        # Its content store and unpacked snapshots: importing the `make images`
        # archives (~1 GB) again on every cold `up` cost ~40 s here.
        return self.image_root

    @property
    def imported_images(self) -> Path:
        # Content keys of the archives imported into this root (realnode.import_images).
        return self.image_root / "trainwave-imported.json"

    @property
    def containerd_state(self) -> Path:
        return self.path("containerd", "state")

    @property
    def shim_socket_dir(self) -> Path:
        # containerd refuses a socket_dir longer than 42 characters (unix socket paths
        # are short), so not under the node dir: /run/twshim-<hash of the node dir>.
        digest = hashlib.sha256(str(self.root).encode()).hexdigest()[:8]
        return Path(f"/run/twshim-{digest}")

    @property
    def runc_root(self) -> Path:
        return self.path("containerd", "runc")

    @property
    def cni_conf_dir(self) -> Path:
        return self.path("cni", "net.d")

    @property
    def cni_ipam_dir(self) -> Path:
        return self.path("cni", "ipam")

    @property
    def kubelet_config(self) -> Path:
        return self.path("kubelet", "config.yaml")

    @property
    def kubelet_kubeconfig(self) -> Path:
        return self.path("kubelet", "kubeconfig")

    @property
    def kubelet_cert_dir(self) -> Path:
        return self.path("kubelet", "pki")

    @property
    def resolv_conf(self) -> Path:
        return self.path("kubelet", "resolv.conf")

    @property
    def pod_logs(self) -> Path:
        return self.path("pod-logs")

    @property
    def proxy_config(self) -> Path:
        return self.path("kube-proxy", "config.yaml")

    @property
    def proxy_kubeconfig(self) -> Path:
        return self.path("kube-proxy", "kubeconfig")

    @property
    def isolated(self) -> bool:
        """Whether the node has a mount namespace and cgroup root of its own: every node
        but the first (realnode_mounts.py says why)."""
        return self.network.index > 1

    @property
    def cgroup_root(self) -> str | None:
        """The kubelet's cgroupRoot, None for the default ("/": kubepods at the top)."""
        return f"/{self.network.netns}" if self.isolated else None


def containerd_config(
    node: NodeLayout, *, major_version: int, sandbox_image: str, runc: Path, cni_bin: Path
) -> str:
    """containerd's config.toml: schema 4 for containerd 2.x, schema 2 for 1.6.

    - own root, state and socket, so the host's containerd (if any) is untouched;
    - runc with cgroupfs (the kubelet's driver) and its state under the node dir;
    - restrict_oom_score_adj: root here lacks CAP_SYS_RESOURCE, and runc fails to
      lower a container's oom_score_adj below its own without it;
    - the sandbox image is the locally imported pause image (pinned, never pulled);
    - CDI on, reading the directory the agent's kubelet plugin writes to (2.x; 1.6 has none);
    - registry hosts from `registry_hosts` (containerd's hosts.toml per registry host: the
      cluster's registry and the CA it trusts, realnode_registry.py);
    - nothing under /run/containerd, /opt/containerd or /var/run/nri on the host.
    """
    runc_options = {
        "BinaryName": str(runc),
        "Root": str(node.runc_root),
        "SystemdCgroup": False,
    }
    runtimes = {"runc": {"runtime_type": "io.containerd.runc.v2", "options": runc_options}}
    socket = str(node.containerd_socket)
    if major_version >= 2:
        # Schema 4 (containerd 2.4): the top-level [grpc] and [ttrpc] addresses are
        # ignored there, so the sockets are set on the server plugins.
        document: dict[str, Any] = {
            "version": 4,
            "root": str(node.containerd_root),
            "state": str(node.containerd_state),
            "imports": [],  # not /etc/containerd/conf.d
            # They would create /opt/containerd and /var/run/nri on the host.
            "disabled_plugins": ["io.containerd.internal.v1.opt", "io.containerd.nri.v1.nri"],
            "plugins": {
                "io.containerd.server.v1.grpc": {"address": socket},
                "io.containerd.server.v1.ttrpc": {"address": socket + ".ttrpc"},
                # Shim sockets, else in /run/containerd/s; removed by `down`.
                "io.containerd.shim.v1.manager": {"socket_dir": str(node.shim_socket_dir)},
                "io.containerd.cri.v1.runtime": {
                    # CDI is always on in 2.x (1.7 needed enable_cdi).
                    "cdi_spec_dirs": list(CDI_SPEC_DIRS),
                    "restrict_oom_score_adj": True,
                    # Pod network namespaces under the node's state dir, not /run/netns.
                    "netns_mounts_under_state_dir": True,
                    "containerd": {"default_runtime_name": "runc", "runtimes": runtimes},
                    "cni": {"bin_dirs": [str(cni_bin)], "conf_dir": str(node.cni_conf_dir)},
                },
                "io.containerd.cri.v1.images": {
                    "snapshotter": "overlayfs",
                    "pinned_images": {"sandbox": sandbox_image},
                    "registry": {"config_path": str(node.registry_hosts)},
                },
                # Exec and port-forward streams, proxied by the kubelet in the same netns.
                "io.containerd.grpc.v1.cri": {"stream_server_address": "127.0.0.1"},
            },
        }
    else:
        # Debian's containerd 1.6: enough for pods, no CDI.
        document = {
            "version": 2,
            "root": str(node.containerd_root),
            "state": str(node.containerd_state),
            "grpc": {"address": socket},
            "ttrpc": {"address": socket + ".ttrpc"},
            "plugins": {
                "io.containerd.grpc.v1.cri": {
                    "sandbox_image": sandbox_image,
                    "restrict_oom_score_adj": True,
                    "containerd": {
                        "snapshotter": "overlayfs",
                        "default_runtime_name": "runc",
                        "runtimes": runtimes,
                    },
                    "cni": {"bin_dir": str(cni_bin), "conf_dir": str(node.cni_conf_dir)},
                    "registry": {"config_path": str(node.registry_hosts)},
                },
                "io.containerd.internal.v1.opt": {"path": str(node.path("containerd", "opt"))},
            },
        }
    return _toml(document)


def cni_config(node: NodeLayout) -> dict[str, Any]:
    """The pod network inside the node namespace: bridge cni0 + host-local IPAM.

    The bridge is the pods' gateway (`isGateway`), and that gateway is the node
    namespace itself, which has no default route. Pods get routes to what they may
    reach (Services, the node and host network, other nodes' pods) and no default
    route either. No masquerading: the host routes the pod subnet to the node.
    """
    return {
        "cniVersion": "1.0.0",
        "name": CNI_NETWORK,
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": node.network.pod_subnet}]],
                    "routes": [
                        {"dst": SERVICE_CIDR_FOR_PODS},
                        {"dst": f"{BRIDGE_IP.rsplit('.', 1)[0]}.0/{BRIDGE_PREFIX}"},
                        {"dst": POD_SUPERNET},
                    ],
                    # Not /var/lib/cni: the node's leases go with the node's dir.
                    "dataDir": str(node.cni_ipam_dir),
                },
            },
        ],
    }


# Kept equal to components.SERVICE_CIDR (not imported: components imports nothing of ours).
SERVICE_CIDR_FOR_PODS = "10.96.0.0/16"


def kubelet_config(
    node: NodeLayout, ca_cert: Path, feature_gates: dict[str, bool]
) -> dict[str, Any]:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "containerRuntimeEndpoint": f"unix://{node.containerd_socket}",
        # The machine is cgroup v1: 1.34 warns, 1.35+ refuses without this.
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        # Otherwise the kubelet installs KUBE-FIREWALL and canary chains; kube-proxy
        # makes what Services need, inside the node namespace.
        "makeIPTablesUtilChains": False,
        "podLogsDir": str(node.pod_logs),
        "clusterDNS": [CLUSTER_DNS_IP],
        "clusterDomain": CLUSTER_DOMAIN,
        # A resolv.conf without nameservers: pods with dnsPolicy Default get no
        # upstream, and nothing can ask a resolver off the machine.
        "resolvConf": str(node.resolv_conf),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(ca_cert)},
        },
        "authorization": {"mode": "Webhook"},
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": 10248,
        "serializeImagePulls": False,
        "rotateCertificates": False,
        # Disk-pressure eviction at the default 10-15 % free would evict test pods on a
        # full CI disk for no reason; memory keeps a small floor.
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
            "nodefs.inodesFree": "1%",
        },
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "featureGates": feature_gates,
    } | ({"cgroupRoot": node.cgroup_root} if node.cgroup_root else {})


def kubelet_command(binary: Path, node: NodeLayout, labels: dict[str, str]) -> list[str]:
    return [
        str(binary),
        f"--config={node.kubelet_config}",
        f"--kubeconfig={node.kubelet_kubeconfig}",
        f"--root-dir={KUBELET_ROOT}",
        f"--cert-dir={node.kubelet_cert_dir}",
        f"--hostname-override={node.name}",
        f"--node-ip={node.network.node_ip}",
        "--node-labels=" + ",".join(f"{k}={v}" for k, v in sorted(labels.items())),
    ]


def proxy_config(node: NodeLayout) -> dict[str, Any]:
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(node.proxy_kubeconfig)},
        "mode": "iptables",
        "hostnameOverride": node.name,
        # Every node's pods, not only this node's: kube-proxy masquerades Service
        # traffic from outside this range, and another node's pod is inside the cluster.
        "clusterCIDR": POD_SUPERNET,
        "bindAddress": node.network.node_ip,
        "healthzBindAddress": "127.0.0.1:10256",
        "metricsBindAddress": "127.0.0.1:10249",
        "nodePortAddresses": [f"{node.network.node_ip}/32"],
        # Leave the host's conntrack table size and timeouts alone: they are global
        # to the machine, not per network namespace.
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
        },
        "iptables": {"masqueradeAll": False, "localhostNodePorts": False},
    }


def proxy_command(binary: Path, node: NodeLayout) -> list[str]:
    return [str(binary), f"--config={node.proxy_config}"]


def containerd_command(binary: Path, node: NodeLayout) -> list[str]:
    return [str(binary), f"--config={node.containerd_config}"]


def _toml(document: dict[str, Any]) -> str:
    """The TOML subset containerd's config needs (tables, strings, bools, ints, lists)."""
    lines: list[str] = []

    def value(item: Any) -> str:
        if isinstance(item, bool):
            return "true" if item else "false"
        if isinstance(item, int):
            return str(item)
        if isinstance(item, str):
            return json.dumps(item)
        if isinstance(item, list):
            return "[" + ", ".join(value(element) for element in item) + "]"
        raise TypeError(f"cannot write {item!r} as TOML")

    def key(name: str) -> str:
        return name if name.replace("_", "").replace("-", "").isalnum() else json.dumps(name)

    def table(path: list[str], body: dict[str, Any]) -> None:
        scalars = {k: v for k, v in body.items() if not isinstance(v, dict)}
        tables = {k: v for k, v in body.items() if isinstance(v, dict)}
        if path and (scalars or not tables):
            lines.append("[" + ".".join(key(p) for p in path) + "]")
        lines.extend(f"{key(k)} = {value(v)}" for k, v in scalars.items())
        if scalars:
            lines.append("")
        for name, sub in tables.items():
            table([*path, name], sub)

    table([], document)
    return "\n".join(lines) + "\n"
