"""Real nodes beside the kwok nodes: kubelet, containerd, runc, CNI and kube-proxy.

Like kind's node containers, each real node lives in a network namespace of its own
(realnode_net.py) but shares the host's filesystem: containerd, the kubelet and kube-proxy
run as host processes moved into the node's namespaces with nsenter. The first node
shares the host's mount namespace too; every further one has a mount namespace and a
cgroup root of its own (realnode_mounts.py), so that two kubelets never share a path or a
`kubepods` tree. The control plane runs on the host and, when real nodes exist, listens on the
nodes' bridge address (components.real_node_apiserver_flags).

`prepare_host` runs before the API server starts (the bridge must exist to bind to),
`start_nodes` after the control plane is up, `refresh_nodes` on a warm `up`, and
`teardown` on `down` (and before any restart): it works from what state.json recorded,
even after a crash, and undoes every change on the host it can, saying what it could not.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import yaml

from cluster import processes, realnode_dns, realnode_mounts, realnode_registry
from cluster import realnode_config as config
from cluster import realnode_host as host
from cluster.api import ApiClient, ApiError
from cluster.components import DRA_GATES, Layout
from cluster.nodes import NOT_READY_TAINT
from cluster.pki import issue_client_cert, write_kubeconfig
from cluster.realnode_net import (
    BRIDGE_IP,
    NodeNetwork,
    ensure_bridge,
    ensure_node_network,
    ensure_peer_routes,
    nsenter_prefix,
    read_sysctls,
    remove_bridge,
    remove_node_network,
    restore_sysctls,
)
from cluster.topology import KWOK_NODE_TYPE_LABEL, Topology, build_node

# Processes of one node, in start order; stopped in reverse.
NODE_PROCESSES = ("containerd", "kubelet", "kube-proxy")
CNI_PLUGINS = ("bridge", "host-local", "loopback")
STOP_GRACE = 5.0
# The address plan has room for more; 3 is what the e2e tier and the fault benchmark run.
MAX_REAL_NODES = 4


@dataclass(frozen=True)
class Context:
    """What the control plane hands the real nodes: where files go, how to find a binary,
    how to start and record a process (`launch(name, argv, env)`), and when to give up."""

    layout: Layout
    state: dict[str, Any]
    tool: Callable[[str], Path]
    launch: Callable[[str, list[str], dict[str, str]], None]
    save: Callable[[], None]
    deadline: float


def node_layouts(layout: Layout, count: int) -> list[config.NodeLayout]:
    return [
        config.NodeLayout(
            layout.root / f"realnode-{index}",
            NodeNetwork(index),
            host.cache_dir() / f"realnode-{index}-containerd",
        )
        for index in range(1, count + 1)
    ]


def process_names(count: int) -> list[str]:
    """The processes real nodes add, in the order `start_nodes` launches them."""
    if not count:
        return []
    nodes = [f"tw-real-{i}/{name}" for i in range(1, count + 1) for name in NODE_PROCESSES]
    return [realnode_registry.PROCESS, *nodes]


def prepare_host(
    layout: Layout, state: dict[str, Any], count: int, save: Callable[[], None]
) -> str:
    """Check what real nodes need, claim /var/lib/kubelet, create the bridge; returns the
    address the API server must listen on. Recorded in `state` before each change."""
    if not 1 <= count <= MAX_REAL_NODES:
        raise RuntimeError(f"--real-nodes {count}: 0 to {MAX_REAL_NODES} are supported")
    host.check_prerequisites()
    host.claim_kubelet_root(layout.root)
    state["real_nodes"] = {
        "count": count,
        # Host paths that did not exist before: `down` removes them.
        "created_paths": host.missing_paths(),
        "sysctls": read_sysctls(),
    }
    save()
    # The agent's kubelet plugin writes CDI specs there; containerd watches it.
    Path(config.CDI_SPEC_DIRS[1]).mkdir(parents=True, exist_ok=True)
    ensure_bridge()
    return BRIDGE_IP


def start_nodes(context: Context, topology: Topology, client: ApiClient) -> None:
    """Start every real node's processes, wait until each is Ready, label it, give it its
    GPU capacity, import the images and deploy cluster DNS."""
    layout, state = context.layout, context.state
    count = state["real_nodes"]["count"]
    environment = _environment(context)
    nodes = node_layouts(layout, count)
    registry = start_registry(context)
    # Every node's namespaces before any node's processes: a mount namespace made later
    # would hold copies of the earlier nodes' pod mounts.
    for node in nodes:
        _write_node_files(context, node)
        ensure_node_network(node.network)
        ensure_peer_routes(node.network, [other.network for other in nodes if other != node])
        realnode_mounts.ensure_namespace(node)
        realnode_mounts.ensure_cgroup_root(node)
    for node in nodes:
        prefix = nsenter_prefix(node.network, realnode_mounts.namespace_of(node))
        context.launch(
            f"{node.name}/containerd",
            prefix + config.containerd_command(context.tool("containerd"), node),
            environment,
        )
        _wait(context, f"containerd socket {node.containerd_socket}", partial(_answers, node))
        # containerd's root outlives clusters: pods a crashed cluster left there would
        # be unknown to this one's API server.
        # Best effort: the kubelet would remove them too, only later.
        _remove_all_pods(node, [])
        import_images(context, node)
        context.launch(
            f"{node.name}/kubelet",
            prefix + config.kubelet_command(context.tool("kubelet"), node, node_labels(topology)),
            environment,
        )
        context.launch(
            f"{node.name}/kube-proxy",
            prefix + config.proxy_command(context.tool("kube-proxy"), node),
            environment,
        )
    push_images(context, registry)
    for node in nodes:
        _wait(context, f"Node {node.name} Ready", partial(_node_ready, client, node.name))
        advertise_capacity(client, node.name, topology)
    realnode_dns.apply(context.tool("kubectl"), layout.kubeconfig, _image_refs())
    _wait(context, "CoreDNS Ready", lambda: realnode_dns.ready(client))


def refresh_nodes(context: Context, topology: Topology, client: ApiClient) -> None:
    """A warm `up`: import images that changed since, put back capacity a test removed."""
    for node in node_layouts(context.layout, context.state["real_nodes"]["count"]):
        import_images(context, node)
        advertise_capacity(client, node.name, topology)
    push_images(context, realnode_registry.files(context.layout.root))


def start_registry(context: Context) -> realnode_registry.RegistryFiles:
    """Start the cluster's image registry on the bridge (realnode_registry.py)."""
    registry = realnode_registry.files(context.layout.root)
    realnode_registry.prepare(registry, context.layout.pki)
    binary = context.tool("registry")
    failed = realnode_registry.collect_garbage(binary, registry)
    if failed:
        print(f"registry: garbage collection failed, blobs kept: {failed}", file=sys.stderr)
    context.launch(
        realnode_registry.PROCESS, realnode_registry.command(binary, registry), dict(os.environ)
    )
    ca_cert = context.layout.pki.ca_cert
    _wait(
        context,
        f"registry at {realnode_registry.HOST}",
        partial(realnode_registry.answers, ca_cert),
    )
    return registry


def push_images(context: Context, registry: realnode_registry.RegistryFiles) -> None:
    """Put the `make images` archives into the registry (the pause and CoreDNS images are
    the nodes' own: imported, never pulled)."""
    own = set(host.IMAGE_ARCHIVES)
    archives = [a for a in host.image_archives() if a.path.name not in own]
    realnode_registry.push_images(registry, context.layout.pki.ca_cert, archives)


def healthy(layout: Layout, state: dict[str, Any], client: ApiClient) -> bool:
    count = (state.get("real_nodes") or {}).get("count", 0)
    return all(_node_ready(client, node.name) for node in node_layouts(layout, count))


def teardown(layout: Layout, state: dict[str, Any]) -> list[str]:
    """Stop the real nodes and undo their changes to the host; returns what failed."""
    real = state.get("real_nodes")
    owner = host.kubelet_root_owner()
    owned = owner == str(layout.root)
    if not real and not owned:
        return []
    problems: list[str] = []
    if owner and not owned:
        # The bridge, the kubepods cgroups and /var/lib/kubelet are another cluster's now.
        problems.append(f"the real node's host state belongs to {owner}; left alone")
        return problems
    records = {p["name"]: p["pid"] for p in state.get("processes", [])}
    count = (real or {}).get("count", 1)
    for node in node_layouts(layout, count):
        alive = {
            name: records[f"{node.name}/{name}"]
            for name in NODE_PROCESSES
            if f"{node.name}/{name}" in records
            and processes.is_alive(records[f"{node.name}/{name}"])
            and str(layout.root) in processes.command_line(records[f"{node.name}/{name}"])
        }
        # The kubelet first, so it does not restart what is being removed; then the
        # pods through containerd, which runs CNI DEL and unmounts their rootfs.
        for name in ("kubelet", "kube-proxy"):
            if name in alive:
                processes.stop_groups([alive[name]], STOP_GRACE)
        if "containerd" in alive:
            _remove_all_pods(node, problems)
            processes.stop_groups([alive["containerd"]], STOP_GRACE)
        host.kill_pod_processes(problems)
        # Shims and anything else still pointing into the node's files.
        processes.stop_groups(processes.processes_referencing(str(node.root) + "/"), STOP_GRACE)
        host.unmount_under(node.root, problems)
        host.unmount_under(node.containerd_root, problems)
        shutil.rmtree(node.shim_socket_dir, ignore_errors=True)
        remove_node_network(node.network, problems)
    host.unmount_under(config.KUBELET_ROOT, problems)
    host.remove_kubepods_cgroups(problems)
    remove_bridge(problems)
    if real:
        restore_sysctls(real.get("sysctls", {}), problems)
        host.remove_created_paths(real.get("created_paths", []), problems)
    if owned or real:
        host.remove_kubelet_root(layout.root, problems)
    return problems


def node_labels(topology: Topology) -> dict[str, str]:
    """The labels of a simulated node of the topology's default shape, as the kubelet
    registers them (`--node-labels`; NodeRestriction allows every one of these), with
    `type=real` instead of `type=kwok` and no RDMA (this machine has no RDMA NIC)."""
    template = _template(topology)
    labels = {
        key: value
        for key, value in template["metadata"]["labels"].items()
        if "kubernetes.io/" not in key  # the kubelet sets hostname, os and arch itself
    }
    labels[KWOK_NODE_TYPE_LABEL] = config.REAL_NODE_TYPE
    return labels


def advertise_capacity(client: ApiClient, name: str, topology: Topology) -> None:
    """Extended resources (`nvidia.com/gpu: 8`, ...) patched into the Node's status
    capacity, the documented way to advertise them by hand. It stands in for NVIDIA's
    device plugin: there is no GPU here, so nothing checks the count against hardware."""
    capacity = _template(topology)["status"]["capacity"]
    extended = {k: v for k, v in capacity.items() if "/" in k}
    if not extended:
        return
    status = client.get(f"/api/v1/nodes/{name}").get("status", {})
    if all(
        status.get(field, {}).get(k) == v
        for field in ("capacity", "allocatable")
        for k, v in extended.items()
    ):
        return
    # Allocatable too: the kubelet derives it from capacity, but only at its next
    # status update, up to 10 s later.
    client.request(
        "PATCH",
        f"/api/v1/nodes/{name}/status",
        {"status": {"capacity": extended, "allocatable": extended}},
        content_type="application/merge-patch+json",
    )


def _template(topology: Topology) -> dict[str, Any]:
    shape = topology.node.model_copy(update={"rdma": None})
    return build_node(
        topology.name, "real", spine="spine-real", rack="rack-real", position=0, shape=shape
    )


def import_images(context: Context, node: config.NodeLayout) -> None:
    """Import the pause, CoreDNS and `make images` archives into containerd's k8s.io
    namespace. containerd's root outlives the cluster (NodeLayout.image_root), so an
    archive imported before with the same content key is skipped, on a cold `up` too."""
    try:
        seen = json.loads(node.imported_images.read_text())
    except (OSError, ValueError):
        seen = {}
    ctr = [str(context.tool("ctr")), f"--address={node.containerd_socket}", "--namespace=k8s.io"]
    listed = subprocess.run(
        [*ctr, "images", "ls", "--quiet"], capture_output=True, text=True, check=False, timeout=60
    )
    present = set(listed.stdout.split())  # a test may have removed one (crictl rmi)
    for archive in host.image_archives():
        if seen.get(archive.ref) == archive.key and archive.ref in present:
            continue
        command = [*ctr, "images", "import", "--snapshotter=overlayfs", str(archive.path)]
        result = subprocess.run(command, capture_output=True, text=True, check=False, timeout=600)
        if result.returncode != 0:
            raise RuntimeError(
                f"importing {archive.path} into {node.name}'s containerd failed: "
                f"{result.stderr.strip()}"
            )
        seen[archive.ref] = archive.key
        node.imported_images.write_text(json.dumps(seen, indent=2))
    _remove_stale_image_ids(ctr)


def _remove_stale_image_ids(ctr: list[str]) -> None:
    """Remove the `sha256:<id>` names the CRI plugin gave images whose tag has moved on.

    Each import of a rebuilt `make images` archive moves its tag to a new image; the CRI
    plugin's name for the old image by its id stays, and with it every layer it holds
    (containerd's root reached 29 GB here over a few days of rebuilds). Without a name the
    content is garbage-collected; a running container keeps its own snapshot."""
    listed = subprocess.run(
        [*ctr, "images", "ls"], capture_output=True, text=True, check=False, timeout=60
    )
    stale = host.stale_image_ids(listed.stdout)
    if stale:
        subprocess.run(
            [*ctr, "images", "rm", *stale], capture_output=True, check=False, timeout=120
        )


def _image_refs() -> dict[str, str]:
    return {archive.path.stem: archive.ref for archive in host.image_archives()}


def _write_node_files(context: Context, node: config.NodeLayout) -> None:
    pki = context.layout.pki
    server = context.state["server"]
    for directory in (
        node.containerd_root, node.containerd_state, node.runc_root, node.cni_conf_dir,
        node.cni_ipam_dir, node.kubelet_cert_dir, node.pod_logs, node.proxy_config.parent,
    ):  # fmt: skip
        directory.mkdir(parents=True, exist_ok=True)
    node_key = node.path("kubelet", "node.key")
    node_cert = node.path("kubelet", "node.crt")
    issue_client_cert(
        pki, node_key, node_cert, user=f"system:node:{node.name}", group="system:nodes"
    )
    write_kubeconfig(node.kubelet_kubeconfig, server, pki, client=(node_cert, node_key))
    proxy_key = node.path("kube-proxy", "proxy.key")
    proxy_cert = node.path("kube-proxy", "proxy.crt")
    # system:kube-proxy is bound to the system:node-proxier role by default.
    issue_client_cert(pki, proxy_key, proxy_cert, user="system:kube-proxy")
    write_kubeconfig(node.proxy_kubeconfig, server, pki, client=(proxy_cert, proxy_key))
    containerd = context.tool("containerd")
    realnode_registry.containerd_hosts(node.registry_hosts, pki.ca_cert)
    node.containerd_config.write_text(
        config.containerd_config(
            node,
            major_version=host.containerd_major_version(containerd),
            sandbox_image=host.archive_ref(host.pause_archive()),
            runc=host.runc_binary(context.tool),
            cni_bin=host.cni_bin_dir(),
        )
    )
    (node.cni_conf_dir / "10-trainwave.conflist").write_text(
        json.dumps(config.cni_config(node), indent=2)
    )
    gates = dict(gate.split("=") for gate in DRA_GATES.split(","))
    node.kubelet_config.write_text(
        yaml.safe_dump(
            config.kubelet_config(node, pki.ca_cert, {k: v == "true" for k, v in gates.items()})
        )
    )
    node.resolv_conf.write_text(
        "# No nameserver: pods use cluster DNS; nothing is resolved off the machine.\n"
    )
    node.proxy_config.write_text(yaml.safe_dump(config.proxy_config(node)))


def _environment(context: Context) -> dict[str, str]:
    bin_dir = context.tool("kubelet").parent
    # containerd finds containerd-shim-runc-v2 on PATH; the kubelet and kube-proxy
    # need mount, iptables and friends from sbin.
    path = f"{bin_dir}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    return dict(os.environ) | {"PATH": path, "NO_PROXY": f"127.0.0.1,{BRIDGE_IP}"}


def _answers(node: config.NodeLayout) -> bool:
    return node.containerd_socket.is_socket()


def _node_ready(client: ApiClient, name: str) -> bool:
    try:
        node = client.get(f"/api/v1/nodes/{name}")
    except (ApiError, OSError):
        return False
    conditions = node.get("status", {}).get("conditions") or []
    ready = any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
    taints = node.get("spec", {}).get("taints") or []
    return ready and not any(t["key"] == NOT_READY_TAINT for t in taints)


def _wait(context: Context, what: str, check: Callable[[], bool]) -> None:
    while not check():
        for record in context.state["processes"]:
            if not processes.is_alive(record["pid"]):
                raise RuntimeError(
                    f"{record['name']} exited while waiting for {what}; see {record['log']}:\n"
                    + _tail(Path(record["log"]))
                )
        if time.monotonic() > context.deadline:
            raise TimeoutError(f"timed out waiting for {what}; logs in {context.layout.logs}")
        time.sleep(0.1)


def _remove_all_pods(node: config.NodeLayout, problems: list[str]) -> None:
    """Stop and remove every pod sandbox through CRI: containerd runs CNI DEL for each
    and unmounts its containers' root filesystems."""
    crictl = shutil.which("crictl", path=str(host.cache_dir() / "bin")) or "crictl"
    endpoint = f"unix://{node.containerd_socket}"
    try:
        result = subprocess.run(
            [crictl, "--config=/dev/null", f"--runtime-endpoint={endpoint}", "rmp", "--all", "--force"],
            capture_output=True, text=True, check=False, timeout=60,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as error:
        problems.append(f"crictl rmp on {node.name}: {error}")
        return
    if result.returncode != 0:
        problems.append(f"crictl rmp on {node.name}: {result.stderr.strip()[:300]}")


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
