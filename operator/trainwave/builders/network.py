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

from collections.abc import Sequence
from typing import Any

from trainwave import contract
from trainwave.api.network import NetworkSpec, RdmaSpec
from trainwave.builders.worker import Worker
from trainwave.hardware.inventory import GpuNicDistance, NicInfo, NodeInventory
from trainwave.hardware.pci import Distance
from trainwave.placement.rdma import LINK_LAYERS, network_requirements, rdma_shortfall

__all__ = ["network_requirements", "node_network_env", "rdma_shortfall", "set_network"]

SHM_VOLUME = "trainwave-shm"


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
        env[contract.ENV_NCCL_SOCKET_IFNAME] = network.socket_interface
    if network.rdma is None:
        return env
    env[contract.ENV_NCCL_IB_DISABLE] = "0"
    if network.rdma.gpu_direct == "Disabled":
        env[contract.ENV_NCCL_NET_GDR_LEVEL] = "LOC"  # never use GPUDirect RDMA
    # The doctor reads NCCL's INIT and NET lines for proof of the transport used.
    env[contract.ENV_NCCL_DEBUG] = "INFO"
    env[contract.ENV_NCCL_DEBUG_SUBSYS] = "INIT,NET"
    return env


def node_network_env(
    network: NetworkSpec | None, inventory: NodeInventory | None
) -> dict[str, str]:
    """NCCL settings for a worker on the node of this inventory (None: the node has none)."""
    if network is None or network.rdma is None or inventory is None:
        return {}
    rdma: RdmaSpec = network.rdma
    nics = _usable_nics(inventory, rdma)
    if not nics:
        return {}
    nearest = inventory.nearest_by_gpu()
    first_gpu: dict[str | None, int] = {}
    for position, near in enumerate(nearest):
        first_gpu.setdefault(near.nic, position)
    # Nearest-GPU order: NCCL hands out the listed ports to local ranks in turn.
    nics.sort(key=lambda nic: (first_gpu.get(nic.hca, len(nearest)), nic.hca))
    # "=" makes NCCL match the names exactly (mlx5_1 must not also select mlx5_10).
    env = {contract.ENV_NCCL_IB_HCA: "=" + ",".join(nic.hca for nic in nics)}
    gid = _roce_v2_gid(nics)
    if gid is not None:
        env[contract.ENV_NCCL_IB_GID_INDEX] = str(gid)
    if rdma.gpu_direct != "Disabled":
        env.update(_gdr_level(inventory, nearest))
    return env


def gang_link_env(network: NetworkSpec | None, inventories: list[NodeInventory]) -> dict[str, str]:
    """TRAINWAVE_INTER_NODE_GBPS for the runtime's `auto` comm choice: the slowest node's
    aggregate rate of the active ports NCCL will use. Only with RDMA configured: over
    TCP the pod network's rate is not something the inventory knows."""
    if network is None or network.rdma is None or not inventories:
        return {}
    rates = []
    for inventory in inventories:
        total = sum(nic.rate_gbps for nic in _usable_nics(inventory, network.rdma))
        if total <= 0:
            return {}
        rates.append(total)
    return {contract.ENV_INTER_NODE_GBPS: f"{min(rates):g}"}


def _usable_nics(inventory: NodeInventory, rdma: RdmaSpec) -> list[NicInfo]:
    layers = LINK_LAYERS[rdma.link_layer]
    return [nic for nic in inventory.active_nics if nic.link_layer in layers]


def _gdr_level(inventory: NodeInventory, nearest: Sequence[GpuNicDistance]) -> dict[str, str]:
    if not inventory.gdr.possible:
        # No peer memory: say so rather than fail later.
        return {contract.ENV_NCCL_NET_GDR_LEVEL: "LOC"}
    distances = [near.distance for near in nearest if near.distance is not None]
    if not distances:
        return {}
    # Allow GPUDirect up to the worst path this node's GPUs have to their
    # nearest NIC: NCCL's default (PXB) silently stages through host memory
    # for every GPU beyond it. Never beyond the host bridge: across NUMA
    # nodes, GPUDirect is slower than staging.
    level = min(max(distances), Distance.PHB)
    return {contract.ENV_NCCL_NET_GDR_LEVEL: level.name}


def _roce_v2_gid(nics: Sequence[NicInfo]) -> int | None:
    """The GID index of RoCE v2 shared by the RoCE ports (NCCL takes one for all)."""
    indexes = {
        min(nic.roce_v2_gid_indices)
        for nic in nics
        if nic.link_layer == "RoCE" and nic.roce_v2_gid_indices
    }
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
    if rdma.resource_name in resources.get("requests", {}):
        # As set_gpus: a differing request would be refused; the user is told (resolving).
        resources["requests"][rdma.resource_name] = rdma.count
    security = container.setdefault("securityContext", {})
    capabilities = security.setdefault("capabilities", {})
    added = list(capabilities.get("add", []))
    if "IPC_LOCK" not in added:
        added.append("IPC_LOCK")  # RDMA registers (pins) memory; the default memlock is tiny
    capabilities["add"] = added
