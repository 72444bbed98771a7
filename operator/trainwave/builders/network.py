"""RDMA / GPUDirect and pod networking, from the job's `network` block. Pure.

Two halves, because a pod's env is fixed at creation but its node is chosen
later (builders/gating.py):
- `set_network` (a pod mutator) writes what does not depend on the node:
  IPC_LOCK (RDMA pins memory), the RDMA resource, a memory-backed /dev/shm,
  Multus networks, host networking and node-independent NCCL settings;
- `node_network_env` derives, from the chosen node's inventory annotation
  (written by the node agent), what does: NCCL_IB_HCA listing exactly the
  node's active ports of the asked link layer, nearest-GPU first, the RoCE v2
  GID index, and NCCL_NET_GDR_LEVEL from the worst GPU<->NIC distance.
`network_requirements` keeps the gang off nodes that cannot provide it.
"""

from collections.abc import Mapping
from typing import Any

from trainwave import contract
from trainwave.api.network import NetworkSpec, RdmaSpec
from trainwave.builders.worker import Worker
from trainwave.placement.rdma import LINK_LAYERS, network_requirements, rdma_shortfall

__all__ = ["network_requirements", "node_network_env", "rdma_shortfall", "set_network"]

SHM_VOLUME = "trainwave-shm"
# NCCL's own spelling of GPU<->NIC path types, best first (NCCL_NET_GDR_LEVEL).
_DISTANCES = ("PIX", "PXB", "PHB", "NODE", "SYS")


def set_network(pod: dict[str, Any], worker: Worker) -> None:
    network = worker.job.spec.network
    if network is None:
        return
    spec = pod["spec"]
    container = next(c for c in spec["containers"] if c["name"] == contract.WORKER_CONTAINER)
    if network.shm_size is not None:
        _mount_shm(spec, container, network.shm_size)
    if network.networks:
        pod["metadata"]["annotations"][contract.ANNOTATION_MULTUS_NETWORKS] = ",".join(
            network.networks
        )
    if network.host_network:
        spec["hostNetwork"] = True
        # Without it, a host-network pod resolves names with the node's DNS and
        # cannot find the gang's headless Service.
        spec["dnsPolicy"] = "ClusterFirstWithHostNet"
    if network.rdma is not None:
        _request_rdma(container, network.rdma)
    # Defaults only: a value the user set in spec.env (say NCCL_DEBUG=WARN) wins.
    present = {e.get("name") for e in container.get("env", [])}
    defaults = static_network_env(network).items()
    container["env"] = [
        *container.get("env", []),
        *({"name": k, "value": v} for k, v in defaults if k not in present),
    ]


def static_network_env(network: NetworkSpec) -> dict[str, str]:
    env: dict[str, str] = {}
    if network.socket_interface:
        env["NCCL_SOCKET_IFNAME"] = network.socket_interface
    if network.rdma is None:
        return env
    env["NCCL_IB_DISABLE"] = "0"
    if network.rdma.gpu_direct == "Disabled":
        env["NCCL_NET_GDR_LEVEL"] = "LOC"  # never use GPUDirect RDMA
    # The doctor reads NCCL's INIT and NET lines for proof of the transport used.
    env["NCCL_DEBUG"] = "INFO"
    env["NCCL_DEBUG_SUBSYS"] = "INIT,NET"
    return env


def node_network_env(network: NetworkSpec | None, inventory: Mapping[str, Any]) -> dict[str, str]:
    """NCCL settings for a worker on the node whose inventory annotation this is."""
    if network is None or network.rdma is None:
        return {}
    rdma: RdmaSpec = network.rdma
    layers = LINK_LAYERS[rdma.link_layer]
    nics = [
        nic for nic in inventory.get("nics") or []
        if nic.get("state") == "ACTIVE" and nic.get("linkLayer") in layers
    ]  # fmt: skip
    if not nics:
        return {}
    nearest = inventory.get("nearestNic") or {}
    by_gpu = [nearest[k] for k in sorted(nearest, key=int)]
    order = {n.get("hca"): i for i, n in reversed(list(enumerate(by_gpu)))}
    nics.sort(key=lambda nic: (order.get(nic.get("hca"), len(order)), nic.get("hca", "")))
    # "=" makes NCCL match the names exactly (mlx5_1 must not also select mlx5_10).
    env = {"NCCL_IB_HCA": "=" + ",".join(str(nic["hca"]) for nic in nics)}
    gid = _roce_v2_gid(nics)
    if gid is not None:
        env["NCCL_IB_GID_INDEX"] = str(gid)
    if rdma.gpu_direct != "Disabled":
        env.update(_gdr_level(inventory, by_gpu))
    return env


def gang_link_env(
    network: NetworkSpec | None, inventories: list[Mapping[str, Any]]
) -> dict[str, str]:
    """TRAINWAVE_INTER_NODE_GBPS for the runtime's `auto` comm choice: the slowest node's
    aggregate rate of the active ports NCCL will use. Only with RDMA configured: over
    TCP the pod network's rate is not something the inventory knows."""
    if network is None or network.rdma is None or not inventories:
        return {}
    layers = LINK_LAYERS[network.rdma.link_layer]
    rates = []
    for inventory in inventories:
        total = sum(
            float(nic.get("rateGbps") or 0)
            for nic in inventory.get("nics") or []
            if nic.get("state") == "ACTIVE" and nic.get("linkLayer") in layers
        )
        if total <= 0:
            return {}
        rates.append(total)
    return {contract.ENV_INTER_NODE_GBPS: f"{min(rates):g}"}


def _gdr_level(inventory: Mapping[str, Any], by_gpu: list[Mapping[str, Any]]) -> dict[str, str]:
    gdr = inventory.get("gdr") or {}
    if not gdr.get("possible"):
        return {"NCCL_NET_GDR_LEVEL": "LOC"}  # no peer memory: say so rather than fail later
    distances = [d.get("distance") for d in by_gpu if d.get("distance") in _DISTANCES]
    if not distances:
        return {}
    # Allow GPUDirect up to the worst path this node's GPUs have to their
    # nearest NIC: NCCL's default (PXB) silently stages through host memory
    # for every GPU beyond it. Never beyond the host bridge: across NUMA
    # nodes, GPUDirect is slower than staging.
    worst = max(distances, key=_DISTANCES.index)
    return {"NCCL_NET_GDR_LEVEL": str(min(worst, "PHB", key=_DISTANCES.index))}


def _roce_v2_gid(nics: list[Mapping[str, Any]]) -> int | None:
    """The GID index of RoCE v2 shared by the RoCE ports (NCCL takes one for all)."""
    indexes: set[int] = set()
    for nic in nics:
        if nic.get("linkLayer") != "RoCE":
            continue
        v2 = [int(i) for i, kind in (nic.get("gidTypes") or {}).items() if kind == "RoCE v2"]
        if v2:
            indexes.add(min(v2))
    return min(indexes) if indexes else None


def _mount_shm(spec: dict[str, Any], container: dict[str, Any], size: int | str) -> None:
    volumes = [v for v in spec.get("volumes", []) if v.get("name") != SHM_VOLUME]
    volumes.append({"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": size}})
    spec["volumes"] = volumes
    mounts = [m for m in container.get("volumeMounts", []) if m.get("mountPath") != "/dev/shm"]
    mounts.append({"name": SHM_VOLUME, "mountPath": "/dev/shm"})
    container["volumeMounts"] = mounts


def _request_rdma(container: dict[str, Any], rdma: RdmaSpec) -> None:
    resources = container.setdefault("resources", {})
    resources.setdefault("limits", {})[rdma.resource_name] = rdma.count
    security = container.setdefault("securityContext", {})
    capabilities = security.setdefault("capabilities", {})
    added = list(capabilities.get("add", []))
    if "IPC_LOCK" not in added:
        added.append("IPC_LOCK")  # RDMA registers (pins) memory; the default memlock is tiny
    capabilities["add"] = added
