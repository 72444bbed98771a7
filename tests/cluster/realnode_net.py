"""The real nodes' network: a bridge on the host, a network namespace per node, routes.

    host (root netns)                        node netns "twnode-1"
    twbr0 198.18.0.1/24  <-- veth -->  tw0 198.18.0.11/24
    route 10.245.1.0/24 via 198.18.0.11      cni0 10.245.1.1/24 (made by the CNI bridge plugin)
                                             pods 10.245.1.2...

198.18.0.0/15 is the RFC 2544 benchmarking range: never routed on the internet, and
disjoint from kwok's pod range (10.244.0.0/16), the Service range (10.96.0.0/16) and
the machine's own network. No namespace created here has a default route, so nothing
a node or pod sends can leave the machine. Everything is done with `ip` (iproute2);
every step is idempotent so `up` after a crash and `down` twice both work.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

BRIDGE = "twbr0"
BRIDGE_IP = "198.18.0.1"
BRIDGE_PREFIX = 24
NETNS_DIR = Path("/run/netns")
# Node N (1-based): address .10+N, pod subnet 10.245.N.0/24.
POD_SUBNET_PREFIX = "10.245"
POD_SUPERNET = "10.245.0.0/16"


@dataclass(frozen=True)
class NodeNetwork:
    """Names and addresses of real node `index` (1-based)."""

    index: int

    @property
    def netns(self) -> str:
        return f"twnode-{self.index}"

    @property
    def netns_path(self) -> Path:
        return NETNS_DIR / self.netns

    @property
    def host_veth(self) -> str:
        return f"twveth{self.index}"

    @property
    def node_veth(self) -> str:
        # Its name inside the node namespace; only visible there.
        return "tw0"

    @property
    def node_ip(self) -> str:
        return f"198.18.0.{10 + self.index}"

    @property
    def pod_subnet(self) -> str:
        return f"{POD_SUBNET_PREFIX}.{self.index}.0/24"


def run(
    *argv: str, check: bool = True, netns: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run a command (in `netns` if given); on failure the error names the command."""
    command = ["ip", "netns", "exec", netns, *argv] if netns else list(argv)
    result = subprocess.run(command, capture_output=True, text=True, check=False, timeout=30)
    if check and result.returncode != 0:
        raise RuntimeError(
            f"`{' '.join(command)}` failed (exit {result.returncode}): {result.stderr.strip()}"
        )
    return result


def link_exists(name: str) -> bool:
    return run("ip", "link", "show", "dev", name, check=False).returncode == 0


def ensure_bridge() -> None:
    """Create twbr0 with 198.18.0.1/24 and bring it up (no-op when it is there)."""
    if not link_exists(BRIDGE):
        run("ip", "link", "add", BRIDGE, "type", "bridge")
    address = f"{BRIDGE_IP}/{BRIDGE_PREFIX}"
    if address not in run("ip", "-o", "addr", "show", "dev", BRIDGE).stdout:
        run("ip", "addr", "add", address, "dev", BRIDGE)
    run("ip", "link", "set", BRIDGE, "up")


def ensure_node_network(node: NodeNetwork) -> None:
    """The node's namespace, its veth into the bridge, its address and the host's pod route.

    Inside the namespace: loopback up, forwarding on (the namespace routes between its
    veth and the pod bridge), bridged pod traffic through iptables (so kube-proxy's
    DNAT is undone on replies between two pods of the same bridge). No default route.
    """
    if not node.netns_path.exists():
        run("ip", "netns", "add", node.netns)
    if not link_exists(node.host_veth):
        run(
            "ip", "link", "add", node.host_veth, "type", "veth",
            "peer", "name", node.node_veth, "netns", node.netns,
        )  # fmt: skip
    run("ip", "link", "set", node.host_veth, "master", BRIDGE)
    run("ip", "link", "set", node.host_veth, "up")
    inside = node.netns
    address = f"{node.node_ip}/{BRIDGE_PREFIX}"
    if address not in run("ip", "-o", "addr", "show", "dev", node.node_veth, netns=inside).stdout:
        run("ip", "addr", "add", address, "dev", node.node_veth, netns=inside)
    run("ip", "link", "set", node.node_veth, "up", netns=inside)
    run("ip", "link", "set", "lo", "up", netns=inside)
    # Per-namespace sysctls: they vanish with the namespace.
    run("sysctl", "-qw", "net.ipv4.ip_forward=1", netns=inside)
    if Path("/proc/sys/net/bridge/bridge-nf-call-iptables").exists():
        run("sysctl", "-qw", "net.bridge.bridge-nf-call-iptables=1", netns=inside)
    run("ip", "route", "replace", node.pod_subnet, "via", node.node_ip, "dev", BRIDGE)


def remove_node_network(node: NodeNetwork, problems: list[str]) -> None:
    """Delete the host route, the namespace (its veth pair and iptables rules go with it)."""
    _try(problems, "ip", "route", "del", node.pod_subnet, ignore="No such process")
    if node.netns_path.exists():
        _try(problems, "ip", "netns", "del", node.netns)
    if link_exists(node.host_veth):
        # Usually gone with the namespace already; the kernel may still be removing it.
        _try(problems, "ip", "link", "del", node.host_veth, ignore="Cannot find device")


def remove_bridge(problems: list[str]) -> None:
    if link_exists(BRIDGE):
        _try(problems, "ip", "link", "del", BRIDGE)


def _try(problems: list[str], *argv: str, ignore: str = "") -> None:
    result = run(*argv, check=False)
    if result.returncode != 0 and not (ignore and ignore in result.stderr):
        problems.append(f"`{' '.join(argv)}`: {result.stderr.strip()}")


def nsenter_prefix(node: NodeNetwork, mount_namespace: Path | None = None) -> list[str]:
    """Run a process in the node's network namespace (and its mount namespace, if given).

    Not `ip netns exec`: that also gives each process a private mount namespace with its
    own /sys, so mounts the kubelet makes for pod volumes would be invisible to
    containerd and runc. nsenter switches the namespaces it is told and nothing else; a
    node's processes all enter the same ones. It execs the command, so the recorded pid
    is the command's own.
    """
    mount = [f"--mount={mount_namespace}"] if mount_namespace else []
    return ["nsenter", f"--net={node.netns_path}", *mount, "--"]


def ensure_peer_routes(node: NodeNetwork, peers: list[NodeNetwork]) -> None:
    """Inside the node's namespace, each other node's pod subnet via that node's address
    on the bridge, as kindnet routes between kind's nodes: pod to pod across nodes goes
    node to node over twbr0, with no forwarding by the host."""
    for peer in peers:
        run(
            "ip", "route", "replace", peer.pod_subnet, "via", peer.node_ip,
            "dev", node.node_veth, netns=node.netns,
        )  # fmt: skip


# Kernel settings the kubelet changes on the host at start (pkg/kubelet/cm
# setupKernelTunables, with protectKernelDefaults off); restored on `down`.
KUBELET_SYSCTLS = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)


def read_sysctls(names: tuple[str, ...] = KUBELET_SYSCTLS) -> dict[str, str]:
    values = {}
    for name in names:
        try:
            values[name] = (Path("/proc/sys") / name).read_text().strip()
        except OSError:
            continue
    return values


def restore_sysctls(saved: dict[str, str], problems: list[str]) -> None:
    for name, value in saved.items():
        path = Path("/proc/sys") / name
        try:
            if path.read_text().strip() != value:
                path.write_text(value + "\n")
        except OSError as error:
            problems.append(f"restore sysctl {name}={value}: {error}")


def direct_environment() -> dict[str, str]:
    """This process's environment with loopback and the bridge exempt from any proxy: nothing
    bound for the local cluster goes through one, whatever the environment says."""
    local = f"127.0.0.1,localhost,{BRIDGE_IP}"
    return dict(os.environ) | {"NO_PROXY": local, "no_proxy": local}
