"""What keeps a second real node's kubelet out of the first one's files and cgroups.

Node 1 shares the host's mount namespace: its files are where any kubelet's are, and tests
read them there (/var/run/cdi, /var/lib/kubelet/plugins_registry). A kubelet hard-codes
some host paths whatever its `--root-dir` says (the device plugin socket dir under
/var/lib/kubelet, the /var/log/containers links), and the chart's agent mounts fixed host
paths by hostPath, so two kubelets on one filesystem would take each other's sockets,
specs and links. Each node from the second on therefore gets:

- a **mount namespace of its own**, kept by a bind mount of its nsfs file under the node
  dir (`unshare --mount=<file>`, as `ip netns` keeps network namespaces), in which the
  paths below are bind mounts of the node's own directories. containerd, the kubelet and
  kube-proxy of the node enter it with nsenter, so runc sees the kubelet's volume mounts
  and hostPath volumes resolve to the node's directories. Propagation is private: the
  node's mounts never appear on the host, and vanish with the namespace;
- a **cgroup root of its own** (`cgroupRoot: /twnode-N`, so its pods go under
  `/sys/fs/cgroup/<controller>/twnode-N/kubepods`), since both kubelets would otherwise
  manage the one `kubepods` tree and each would remove the other's pod cgroups.

The namespaces are made before any node process starts, so they hold no copy of another
node's pod mounts.
"""

from __future__ import annotations

import os
from pathlib import Path

from cluster import realnode_host as host
from cluster.realnode_config import NodeLayout
from cluster.realnode_net import run

# Host paths a node's kubelet, containerd and the chart's agent write at fixed places;
# each node from the second on sees its own directory there.
PRIVATE_PATHS = (
    "/var/lib/kubelet",
    "/var/log/containers",
    "/var/run/cdi",
    "/run/trainwave",
)


def namespace_file(node: NodeLayout) -> Path:
    return node.path("mntns", "ns")


def node_dir_for(node: NodeLayout, host_path: str) -> Path:
    return node.path("host", host_path.strip("/").replace("/", "_"))


def ensure_namespace(node: NodeLayout) -> None:
    """Create the node's mount namespace with its private paths bound in (idempotent)."""
    if not node.isolated:
        return
    holder = namespace_file(node).parent
    if str(namespace_file(node)) in host.mounts_under(holder):
        return
    holder.mkdir(parents=True, exist_ok=True)
    # unshare keeps a namespace by bind-mounting it onto a file, which must sit on a
    # mount with private propagation: the holder dir bound onto itself and made private.
    if str(holder) not in host.mounts_under(holder):
        run("mount", "--bind", str(holder), str(holder))
    run("mount", "--make-private", str(holder))
    namespace_file(node).touch()
    run("unshare", f"--mount={namespace_file(node)}", "--propagation=private", "true")
    for host_path in PRIVATE_PATHS:
        target = os.path.realpath(host_path)  # /var/run is /run: bind onto the real path
        Path(target).mkdir(parents=True, exist_ok=True)
        source = node_dir_for(node, host_path)
        source.mkdir(parents=True, exist_ok=True)
        run(
            "nsenter",
            f"--mount={namespace_file(node)}",
            "--",
            "mount",
            "--bind",
            str(source),
            target,
        )


def namespace_of(node: NodeLayout) -> Path | None:
    """The node's mount namespace file; None for the first node (the host's)."""
    return namespace_file(node) if node.isolated else None


def ensure_cgroup_root(node: NodeLayout) -> None:
    """Create the node's cgroupRoot in every v1 controller: the kubelet refuses one that
    does not exist. A new cpuset cgroup has no CPUs or memory nodes until given its parent's."""
    if node.cgroup_root is None:
        return
    for controller in host.cgroup_controllers():
        path = controller / node.cgroup_root.lstrip("/")
        path.mkdir(exist_ok=True)
        for name in ("cpuset.cpus", "cpuset.mems"):
            if (path / name).exists() and not (path / name).read_text().strip():
                (path / name).write_text((controller / name).read_text())
