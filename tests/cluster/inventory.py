"""The node agent's inventory annotation for a simulated node.

Built from the agent's own dataclasses and rendered by the same
`encode`, so a kwok node carries exactly what the agent would
publish for a real HGX-style node: GPU i and NIC i behind one PCIe switch
(distance PIX), half the GPUs on each NUMA node, RoCE v2 at GID index 3.
"""

from __future__ import annotations

import hashlib

from trainwave.contract import ANNOTATION_INVENTORY
from trainwave.hardware.inventory import (
    GdrReadiness,
    GpuInfo,
    GpuNicDistance,
    NicInfo,
    NodeInventory,
    encode,
)
from trainwave.hardware.pci import Distance

ROCE_V2_GID_INDEX = 3


def inventory_annotation(
    node: str,
    *,
    gpus: int,
    product: str,
    memory_mib: int,
    nics: int,
    link_layer: str | None,
    rate_gbps: float,
    gpu_direct: bool,
    shared: bool = False,
) -> dict[str, str]:
    per_numa = max(1, gpus // 2)
    gpu_infos = simulated_gpus(node, gpus=gpus, product=product, memory_mib=memory_mib)
    nic_infos: tuple[NicInfo, ...] = ()
    nearest: tuple[GpuNicDistance, ...] = ()
    if link_layer is not None:
        gids = ((ROCE_V2_GID_INDEX, "RoCE v2"),) if link_layer == "RoCE" else ()
        nic_infos = tuple(
            NicInfo(
                name=f"mlx5_{i}",
                port=1,
                state="ACTIVE",
                link_layer=link_layer,  # type: ignore[arg-type]
                rate_gbps=rate_gbps,
                pci_path=f"pci0000:{i:02x}/0000:{i:02x}:01.0/0000:{0x19 + 0x10 * i:02x}:00.0",
                numa_node=min(i, gpus - 1) // per_numa if gpus else 0,
                gid_types=gids,
            )
            for i in range(nics)
        )
        nearest = tuple(
            GpuNicDistance(gpu_index=i, nic=f"mlx5_{i % nics}:1", distance=Distance.PIX)
            for i in range(gpus)
        )
    gdr = GdrReadiness(
        possible=gpu_direct and link_layer is not None,
        peer_memory="nvidia_peermem" if gpu_direct else None,
        dmabuf=False,
        reason="nvidia_peermem loaded" if gpu_direct else "no peer-memory module, no DMA-BUF",
    )
    inventory = NodeInventory(
        gpus=gpu_infos,
        nvlink_islands=(tuple(range(gpus)),) if gpus > 1 else (),
        nics=nic_infos,
        nearest_nics=nearest,
        gdr=gdr,
        shared=tuple(range(gpus)) if shared else (),
    )
    return {ANNOTATION_INVENTORY: encode(inventory)}


def simulated_gpus(node: str, *, gpus: int, product: str, memory_mib: int) -> tuple[GpuInfo, ...]:
    """The GPUs of a simulated node, as the agent's discovery would report them."""
    per_numa = max(1, gpus // 2)
    return tuple(
        GpuInfo(
            index=i,
            uuid=_uuid(node, i),
            product=product,
            memory_mib=memory_mib,
            pci_bus_id=f"0000:{0x18 + 0x10 * i:02x}:00.0",
            numa_node=i // per_numa,
            pci_path=f"pci0000:{i:02x}/0000:{i:02x}:01.0/0000:{0x18 + 0x10 * i:02x}:00.0",
        )
        for i in range(gpus)
    )


def _uuid(node: str, index: int) -> str:
    digest = hashlib.sha256(f"{node}/{index}".encode()).hexdigest()
    return f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"
