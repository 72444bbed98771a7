"""A node inventory -> the labels and annotations the node carries.

Pure. The label values match what the simulated cluster writes
(tests/cluster/topology.py `build_node`), so placement reads kwok nodes and
real nodes alike; GPU labels follow GPU feature discovery's spelling.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace

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
from trainwave.hardware.inventory import GpuInfo, NodeInventory, encode

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
    offered = replace(inventory, shared=tuple(gpu.index for gpu in shared))
    return {ANNOTATION_INVENTORY: encode(offered)}


def product_label(name: str) -> str:
    """`NVIDIA H100 80GB HBM3` -> `NVIDIA-H100-80GB-HBM3`, a valid label value."""
    value = _NOT_IN_LABEL.sub("-", name.strip())[:63]
    return value.strip("-_.")
