"""What a job's RDMA asks of nodes, and why no node of a cluster can give it. Pure.

The operator keeps an RDMA gang to nodes whose agent found active ports of the
asked link layer (label trainwave.io/rdma) and, for gpuDirect Required, a working
GPUDirect path (trainwave.io/gpudirect-rdma=true). When no node of the cluster has
them, busy or not, the job fails with reason RDMAUnavailable instead of waiting.
"""

from trainwave import contract
from trainwave.api.network import NetworkSpec
from trainwave.placement import explain
from trainwave.placement.snapshot import ClusterSnapshot, Selector

LINK_LAYERS = {"InfiniBand": ("IB",), "RoCE": ("RoCE",), "Any": ("IB", "RoCE")}


def network_requirements(network: NetworkSpec | None) -> dict[str, str | frozenset[str]]:
    """Node label requirements: where the gang can get the RDMA it asks for."""
    if network is None or network.rdma is None:
        return {}
    layers = frozenset(
        contract.RDMA_LINK_LAYER_LABELS[x] for x in LINK_LAYERS[network.rdma.link_layer]
    )
    wanted: dict[str, str | frozenset[str]] = {
        contract.NODE_LABEL_RDMA: next(iter(layers)) if len(layers) == 1 else layers
    }
    if network.rdma.gpu_direct == "Required":
        wanted[contract.NODE_LABEL_GPUDIRECT] = "true"
    return wanted


def rdma_shortfall(
    network: NetworkSpec | None, selector: Selector, snapshot: ClusterSnapshot
) -> str | None:
    """Why no node of the cluster can give the gang its RDMA, or None when some can.

    Counted over every node the job's own nodeSelector allows, busy or not:
    this is not "wait for room" but "this cluster does not have it".
    """
    if network is None or network.rdma is None or any(snapshot.matching(selector)):
        return None
    wanted = network_requirements(network)
    base = {k: v for k, v in selector.items() if k not in wanted}
    allowed = sum(snapshot.matching(base))
    rdma_key = contract.NODE_LABEL_RDMA
    with_rdma = sum(snapshot.matching({**base, rdma_key: wanted[rdma_key]}))
    asked = f"linkLayer {network.rdma.link_layer}, gpuDirect {network.rdma.gpu_direct}"
    where = f"{allowed} node(s) the job may use" + explain.scope(base)
    if with_rdma == 0:
        return f"asks for RDMA ({asked}); none of the {where} has active RDMA ports of that kind"
    return (
        f"asks for RDMA ({asked}); {with_rdma} of the {where} have RDMA but none has "
        "working GPUDirect RDMA (no peer-memory module or DMA-BUF; see the node's "
        f"{contract.ANNOTATION_INVENTORY} annotation)"
    )
