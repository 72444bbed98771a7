"""The `network` block of a TrainingJob: RDMA / GPUDirect and the pod's networking. Pure.

What a user states here becomes pod settings (builders/network.py) and a
requirement on the nodes the gang may use (builders/gangs.py): an RDMA job
only goes where the node agent found active RDMA ports of the asked link
layer, and, with `gpuDirect: Required`, a working GPUDirect RDMA path.
"""

from typing import Annotated, Literal

from pydantic import ConfigDict, Field, StringConstraints

from trainwave import contract
from trainwave.api.base import ApiModel, Quantity, cel, validations

LinkLayer = Literal["Any", "InfiniBand", "RoCE"]
GpuDirect = Literal["Required", "Preferred", "Disabled"]
# A Multus network: "name" or "namespace/name", optionally "@interface".
NETWORK_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?/)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(@[a-zA-Z0-9_.-]{1,15})?$"
)
INTERFACE_PATTERN = r"^[\^=]?[a-zA-Z0-9_.:-]{1,15}(,[\^=]?[a-zA-Z0-9_.:-]{1,15})*$"


class RdmaSpec(ApiModel):
    resource_name: str = Field(
        default=contract.RDMA_RESOURCE,
        max_length=253,
        pattern=r"^[a-z0-9.-]+/[a-zA-Z0-9_.-]+$",
        description="resourceName: the RDMA device plugin's extended resource each worker "
        f"requests. Default {contract.RDMA_RESOURCE}.",
    )
    count: int = Field(
        default=1,
        ge=1,
        le=64,
        description="count: how many of resourceName each worker requests. Default 1.",
    )
    link_layer: LinkLayer = Field(
        default="Any",
        description="linkLayer: InfiniBand, RoCE, or Any (either). Nodes without active "
        "ports of this kind are not used.",
    )
    gpu_direct: GpuDirect = Field(
        default="Preferred",
        description="gpuDirect: Required uses only nodes where GPUDirect RDMA works "
        "(peer memory or DMA-BUF); Preferred lets NCCL use it where it can; Disabled "
        "stages through host memory.",
    )


class NetworkSpec(ApiModel):
    model_config = ConfigDict(
        **ApiModel.model_config,
        json_schema_extra=validations(
            cel(
                "!(has(self.hostNetwork) && self.hostNetwork) || !has(self.networks) || "
                "size(self.networks) == 0",
                "spec.network.networks must be empty with hostNetwork: true (a pod on the "
                "host's network gets no extra interfaces)",
                ".networks",
            )
        ),
    )

    rdma: RdmaSpec | None = Field(
        default=None,
        description="rdma: RDMA for NCCL: IPC_LOCK, the RDMA resource, NCCL settings "
        "matched to each node's NICs, and only nodes that have them.",
    )
    networks: list[Annotated[str, StringConstraints(pattern=NETWORK_PATTERN, max_length=253)]] = (
        Field(
            default_factory=list,
            max_length=16,
            description="networks: Multus NetworkAttachmentDefinitions to attach "
            "('name', 'namespace/name', optionally '@interface'); becomes the "
            "k8s.v1.cni.cncf.io/networks annotation.",
        )
    )
    host_network: bool = Field(
        default=False,
        description="hostNetwork: run workers on the host's network namespace (all host "
        "NICs visible; ports must not collide).",
    )
    shm_size: Quantity | None = Field(
        default="16Gi",
        description="shmSize: size of the memory-backed /dev/shm (NCCL and data loaders "
        "need more than a container's default 64Mi). null keeps the default.",
    )
    socket_interface: str | None = Field(
        default=None,
        max_length=255,
        pattern=INTERFACE_PATTERN,
        description="socketInterface: NCCL_SOCKET_IFNAME, the interfaces NCCL's bootstrap "
        "and socket transport use (e.g. eth0, or ^lo,docker).",
    )
