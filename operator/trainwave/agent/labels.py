"""A node inventory -> the labels and annotations the node carries.

Pure. The label values match what the simulated cluster writes
(tests/cluster/topology.py `build_node`), so placement reads kwok nodes and
real nodes alike; GPU labels follow GPU feature discovery's spelling.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

from trainwave.agent.inventory import GpuInfo, NodeInventory
from trainwave.contract import (
    ANNOTATION_INVENTORY,
    NODE_LABEL_GPU_COUNT,
    NODE_LABEL_GPU_MEMORY,
    NODE_LABEL_GPU_PRODUCT,
    NODE_LABEL_GPUDIRECT,
    NODE_LABEL_NVLINK_DOMAIN,
    NODE_LABEL_RDMA,
    NODE_LABEL_RDMA_NICS,
    RDMA_LINK_LAYER_LABELS,
)

_NOT_IN_LABEL = re.compile(r"[^A-Za-z0-9_.-]+")


def build_labels(inventory: NodeInventory, *, nvlink_domain: str) -> dict[str, str]:
    """Labels for the node; `nvlink_domain` names this node's NVLink domain.

    On HGX-style boards every node is its own domain, so the caller passes the
    node name; multi-node NVLink (a GB200 clique) will pass the clique instead.
    GPU product and memory describe the first GPU, as GPU feature discovery does.
    """
    labels: dict[str, str] = {}
    if inventory.gpus:
        first = inventory.gpus[0]
        labels[NODE_LABEL_GPU_PRODUCT] = product_label(first.product)
        labels[NODE_LABEL_GPU_COUNT] = str(len(inventory.gpus))
        labels[NODE_LABEL_GPU_MEMORY] = str(first.memory_mib)
        labels[NODE_LABEL_NVLINK_DOMAIN] = nvlink_domain
    layers: Counter[str] = Counter(nic.link_layer for nic in inventory.active_nics)
    if layers:
        # A node may carry IB ports for training and an Ethernet port for
        # storage: advertise the fabric most ports are on (IB on a tie).
        layer = max(("IB", "RoCE"), key=lambda name: layers[name])
        labels[NODE_LABEL_RDMA] = RDMA_LINK_LAYER_LABELS[layer]
        labels[NODE_LABEL_RDMA_NICS] = str(layers[layer])
        if inventory.gpus:  # GPUDirect RDMA is about GPU memory: no GPUs, no claim
            labels[NODE_LABEL_GPUDIRECT] = "true" if inventory.gdr.possible else "false"
    return labels


def build_annotations(inventory: NodeInventory, shared: Sequence[GpuInfo] = ()) -> dict[str, str]:
    """The inventory annotation; `shared` are the GPUs offered for sharing (`sharing.py`)."""
    document = inventory_document(inventory, shared)
    return {ANNOTATION_INVENTORY: json.dumps(document, separators=(",", ":"), sort_keys=True)}


def inventory_document(inventory: NodeInventory, shared: Sequence[GpuInfo] = ()) -> dict[str, Any]:
    """The inventory as JSON-ready data, in the camelCase of the Kubernetes API.

    `sharedGpus` lists what the node's shared-GPU-memory resource adds up, GPU
    by GPU, so the operator can pin a pod to one of them by UUID.
    """
    return {
        "gpus": [
            {
                "index": gpu.index,
                "uuid": gpu.uuid,
                "product": gpu.product,
                "memoryMiB": gpu.memory_mib,
                "pciBusId": gpu.pci_bus_id,
                "numaNode": gpu.numa_node,
            }
            for gpu in inventory.gpus
        ],
        "nvlinkIslands": [list(island) for island in inventory.nvlink_islands],
        "nics": [
            {
                "hca": nic.hca,
                "state": nic.state,
                "linkLayer": nic.link_layer,
                "rateGbps": nic.rate_gbps,
                "pciPath": nic.pci_path,
                "numaNode": nic.numa_node,
                "gidTypes": {str(index): kind for index, kind in nic.gid_types},
            }
            for nic in inventory.nics
        ],
        "nearestNic": {
            str(near.gpu_index): {
                "hca": near.nic,
                "distance": near.distance.name if near.distance is not None else None,
                "gdrInReach": near.gdr_in_reach,
            }
            for near in inventory.nearest_nics
        },
        "gdr": {
            "possible": inventory.gdr.possible,
            "peerMemory": inventory.gdr.peer_memory,
            "dmabuf": inventory.gdr.dmabuf,
            "reason": inventory.gdr.reason,
        },
        "sharedGpus": [
            {"index": gpu.index, "uuid": gpu.uuid, "memoryMiB": gpu.memory_mib} for gpu in shared
        ],
        "problems": list(inventory.problems),
    }


def product_label(name: str) -> str:
    """`NVIDIA H100 80GB HBM3` -> `NVIDIA-H100-80GB-HBM3`, a valid label value."""
    value = _NOT_IN_LABEL.sub("-", name.strip())[:63]
    return value.strip("-_.")
