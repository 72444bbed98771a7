"""Simulated GPU cluster topologies: a compact YAML file -> kwok Node manifests.

Pure: no cluster, no clock, no globals. `parse_topology` validates a mapping
(the YAML document) into models, `build_nodes` renders the models into Node
manifests the control plane harness creates as they are.

The file describes spines -> racks -> nodes, and grows by counts, not by
listing nodes, so 1,024 nodes fit in a dozen lines:

    name: large
    node:                        # the shape of every node, unless overridden
      gpu: {product: NVIDIA-H100-80GB-HBM3, count: 8, memoryMiB: 81559}
      nvlink: {nodesPerDomain: 1}
      rdma: {nics: 8, linkLayer: IB, rateGbps: 400}
    spines:
    - count: 4                   # four identical spines ...
      racks:
      - count: 16                # ... of sixteen racks ...
        nodes: 16                # ... of sixteen nodes each

Heterogeneity comes from `node` overrides on a spine group or a rack group,
merged field by field over the shape above them (`rdma: null` removes RDMA).

Names are derived from global positions, so they are stable for a given file:
spines `spine-0..`, racks `rack-00..` (numbered across spines), nodes
`<nodeNamePrefix>-r<rack>-n<node>`. An NVLink domain never crosses a rack: it
groups `nodesPerDomain` consecutive nodes of one rack (1 = every node is its
own domain, as on HGX boards; 18 = a GB200 NVL72 rack).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic.alias_generators import to_camel

from cluster.inventory import inventory_annotation
from trainwave.contract import (
    GPU_RESOURCE,
    NODE_LABEL_GPU_CLIQUE,
    NODE_LABEL_GPU_COUNT,
    NODE_LABEL_GPU_MEMORY,
    NODE_LABEL_GPU_PRODUCT,
    NODE_LABEL_GPUDIRECT,
    NODE_LABEL_NVLINK_DOMAIN,
    NODE_LABEL_RACK,
    NODE_LABEL_RDMA,
    NODE_LABEL_RDMA_NICS,
    NODE_LABEL_SPINE,
    RDMA_LINK_LAYER_LABELS,
    RDMA_RESOURCE,
    SHARED_GPU_MEMORY_RESOURCE,
)

# kwok manages exactly the nodes carrying this annotation (see controlplane.py).
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_NODE_VALUE = "fake"
KWOK_NODE_TYPE_LABEL = "type"
KWOK_NODE_TYPE = "kwok"

# Far beyond what 2 cores serve well (1,024 nodes idle at ~22% of a core), but
# a typo such as `count: 1000` on a spine should fail fast, not exhaust memory.
MAX_NODES = 20_000

# The label value each RDMA link layer is advertised as.

_QUANTITY = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?[0-9]+))?$"
)
_LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
_DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


class TopologyError(ValueError):
    """A topology file that cannot be rendered; the message names the field."""


class _Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )


class GpuSpec(_Model):
    product: str = Field(
        max_length=63,
        pattern=_LABEL_VALUE,
        description="product: GPU model as GPU feature discovery labels it, "
        "e.g. NVIDIA-H100-80GB-HBM3.",
    )
    count: int = Field(ge=1, le=64, description="count: GPUs per node.")
    memory_mib: int = Field(
        alias="memoryMiB", ge=1, description="memoryMiB: memory of one GPU in MiB."
    )
    shared: bool = Field(
        default=False,
        description="shared: the node agent offers every GPU for sharing (inventory "
        "sharedGpus and the trainwave.io/gpu-memory resource).",
    )


class NvlinkSpec(_Model):
    nodes_per_domain: int = Field(
        default=1,
        ge=1,
        description="nodesPerDomain: consecutive nodes of a rack sharing one NVLink domain.",
    )


class RdmaSpec(_Model):
    nics: int = Field(ge=1, le=64, description="nics: RDMA NICs per node.")
    link_layer: Literal["IB", "RoCE"] = Field(description="linkLayer: IB or RoCE.")
    rate_gbps: int = Field(
        ge=1,
        description="rateGbps: line rate of one NIC. Recorded in the model only: "
        "the contract has no node label for it yet.",
    )
    gpu_direct: bool = Field(
        default=True,
        description="gpuDirect: whether GPUDirect RDMA works (a peer-memory module is loaded).",
    )
    hca_max: int = Field(
        default=1000,
        ge=1,
        description="hcaMax: pods that may share the RDMA device (rdmaHcaMax of the "
        "shared device plugin); becomes the RDMA resource capacity.",
    )


class NodeShape(_Model):
    cpu: str = Field(default="128", description="cpu: capacity, a quantity.")
    memory: str = Field(default="2Ti", description="memory: capacity, a quantity.")
    ephemeral_storage: str = Field(
        default="10Ti", description="ephemeralStorage: capacity, a quantity."
    )
    pods: int = Field(default=110, ge=1, description="pods: pods the node accepts.")
    gpu: GpuSpec | None = Field(default=None, description="gpu: GPUs; null for CPU-only.")
    nvlink: NvlinkSpec = Field(default_factory=NvlinkSpec, description="nvlink: domains.")
    rdma: RdmaSpec | None = Field(default=None, description="rdma: NICs; null for none.")

    @field_validator("cpu", "memory", "ephemeral_storage", mode="before")
    @classmethod
    def _is_quantity(cls, value: object) -> str:
        # YAML reads `cpu: 96` as an int; a quantity is a string on the wire.
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise ValueError("expected a Kubernetes quantity such as 96, 500m or 2Ti")
        if not re.match(_QUANTITY, str(value)):
            raise ValueError("expected a Kubernetes quantity such as 96, 500m or 2Ti")
        return str(value)


class RackGroup(_Model):
    count: int = Field(default=1, ge=1, description="count: identical racks in this group.")
    nodes: int = Field(ge=1, le=1000, description="nodes: nodes in each rack.")
    node: dict[str, Any] | None = Field(
        default=None, description="node: overrides of the node shape for these racks."
    )


class SpineGroup(_Model):
    count: int = Field(default=1, ge=1, description="count: identical spines in this group.")
    racks: list[RackGroup] = Field(min_length=1, description="racks: rack groups per spine.")
    node: dict[str, Any] | None = Field(
        default=None, description="node: overrides of the node shape under these spines."
    )


class Topology(_Model):
    name: str = Field(max_length=30, pattern=_DNS_LABEL, description="name: of the cluster.")
    node_name_prefix: str = Field(
        default="gpu",
        max_length=20,
        pattern=_DNS_LABEL,
        description="nodeNamePrefix: nodes are named <prefix>-r<rack>-n<node>.",
    )
    node: NodeShape = Field(default_factory=NodeShape, description="node: the default shape.")
    spines: list[SpineGroup] = Field(min_length=1, description="spines: spine groups.")


def load_topology(path: Path) -> Topology:
    """Read and validate a topology file; errors name the file and the field."""
    try:
        document = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as error:
        raise TopologyError(f"{path}: cannot read topology: {error}") from error
    return parse_topology(document, source=str(path))


def parse_topology(document: Any, source: str = "topology") -> Topology:
    """Validate a topology document, including every node override it holds."""
    if not isinstance(document, Mapping):
        raise TopologyError(f"{source}: expected a mapping, got {type(document).__name__}")
    try:
        topology = Topology.model_validate(document)
    except ValidationError as error:
        raise TopologyError(_describe(error, source, prefix=())) from error
    total = sum(s.count * sum(r.count * r.nodes for r in s.racks) for s in topology.spines)
    if total > MAX_NODES:
        raise TopologyError(
            f"{source}: spines: {total} nodes in all; at most {MAX_NODES} fit a local control plane"
        )
    # Overrides are free-form until merged; resolve each once so a bad one is
    # reported now, with its position, rather than in the middle of `up`.
    for spine_index, spine in enumerate(topology.spines):
        for rack_index in range(len(spine.racks)):
            _shape_for(topology, spine_index, rack_index, source)
    return topology


def build_nodes(topology: Topology) -> list[dict[str, Any]]:
    """Render every Node of the topology, in rack order, with labels and capacity."""
    rack_total = sum(s.count * sum(r.count for r in s.racks) for s in topology.spines)
    nodes_max = max(r.nodes for s in topology.spines for r in s.racks)
    rack_width = max(2, len(str(rack_total - 1)))
    node_width = max(2, len(str(nodes_max - 1)))

    manifests: list[dict[str, Any]] = []
    spine_number = 0
    rack_number = 0
    for spine_index, spine_group in enumerate(topology.spines):
        for _ in range(spine_group.count):
            spine_name = f"spine-{spine_number}"
            for rack_index, rack_group in enumerate(spine_group.racks):
                shape = _shape_for(topology, spine_index, rack_index, source="topology")
                for _ in range(rack_group.count):
                    rack_name = f"rack-{rack_number:0{rack_width}d}"
                    for position in range(rack_group.nodes):
                        name = (
                            f"{topology.node_name_prefix}-r{rack_number:0{rack_width}d}"
                            f"-n{position:0{node_width}d}"
                        )
                        node = build_node(
                            topology.name,
                            name,
                            spine=spine_name,
                            rack=rack_name,
                            position=position,
                            shape=shape,
                        )
                        manifests.append(node)
                    rack_number += 1
            spine_number += 1
    return manifests


def build_node(
    cluster: str, name: str, *, spine: str, rack: str, position: int, shape: NodeShape
) -> dict[str, Any]:
    """One kwok Node; `position` is the node's index inside its rack."""
    labels = {
        KWOK_NODE_TYPE_LABEL: KWOK_NODE_TYPE,
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        NODE_LABEL_SPINE: spine,
        NODE_LABEL_RACK: rack,
    }
    capacity: dict[str, str] = {
        "cpu": str(shape.cpu),
        "memory": shape.memory,
        "ephemeral-storage": shape.ephemeral_storage,
        "pods": str(shape.pods),
    }
    if shape.gpu is not None:
        domain_size = shape.nvlink.nodes_per_domain
        domain = f"{rack}-nvl{position // domain_size}"
        labels |= {
            NODE_LABEL_NVLINK_DOMAIN: domain,
            NODE_LABEL_GPU_PRODUCT: shape.gpu.product,
            NODE_LABEL_GPU_COUNT: str(shape.gpu.count),
            NODE_LABEL_GPU_MEMORY: str(shape.gpu.memory_mib),
        }
        if domain_size > 1:
            # GPU feature discovery sets the clique only on multi-node NVLink
            # systems, as "<cluster>.<clique>"; mirror that.
            labels[NODE_LABEL_GPU_CLIQUE] = f"{cluster}.{domain}"
        capacity[GPU_RESOURCE] = str(shape.gpu.count)
        if shape.gpu.shared:
            capacity[SHARED_GPU_MEMORY_RESOURCE] = str(shape.gpu.count * shape.gpu.memory_mib)
    if shape.rdma is not None:
        labels[NODE_LABEL_RDMA] = RDMA_LINK_LAYER_LABELS[shape.rdma.link_layer]
        labels[NODE_LABEL_RDMA_NICS] = str(shape.rdma.nics)
        if shape.gpu is not None:
            labels[NODE_LABEL_GPUDIRECT] = "true" if shape.rdma.gpu_direct else "false"
        capacity[RDMA_RESOURCE] = str(shape.rdma.hca_max)
    annotations = {
        KWOK_NODE_ANNOTATION: KWOK_NODE_VALUE,
        # ttl "0": the TTL controller would otherwise patch every node once.
        "node.alpha.kubernetes.io/ttl": "0",
    }
    if shape.gpu is not None:
        # What the node agent would publish for this hardware.
        annotations |= inventory_annotation(
            name,
            gpus=shape.gpu.count,
            product=shape.gpu.product,
            memory_mib=shape.gpu.memory_mib,
            nics=shape.rdma.nics if shape.rdma else 0,
            link_layer=shape.rdma.link_layer if shape.rdma else None,
            rate_gbps=shape.rdma.rate_gbps if shape.rdma else 0,
            gpu_direct=shape.rdma.gpu_direct if shape.rdma else False,
            shared=shape.gpu.shared,
        )
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": annotations,
            "labels": labels,
        },
        # The node strategy keeps status on create, so capacity is set in one
        # request; kwok's node-initialize stage keeps it and adds conditions.
        "status": {"capacity": capacity, "allocatable": dict(capacity)},
    }


def _shape_for(topology: Topology, spine_index: int, rack_index: int, source: str) -> NodeShape:
    """The node shape of one rack group: the default, then spine, then rack overrides."""
    spine = topology.spines[spine_index]
    rack = spine.racks[rack_index]
    shape = topology.node
    layers = (
        (spine.node, ("spines", spine_index, "node")),
        (rack.node, ("spines", spine_index, "racks", rack_index, "node")),
    )
    for overrides, where in layers:
        if not overrides:
            continue
        merged = _merge(shape.model_dump(by_alias=True), overrides)
        try:
            shape = NodeShape.model_validate(merged)
        except ValidationError as error:
            raise TopologyError(_describe(error, source, prefix=where)) from error
    return shape


def _merge(base: dict[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Field-by-field merge; a nested mapping merges, anything else (null too) replaces."""
    merged = dict(base)
    for key, value in overrides.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


_PATTERN_HELP = {
    _LABEL_VALUE: "a label value: at most 63 letters, digits, '-', '_' or '.', "
    "starting and ending with a letter or digit",
    _DNS_LABEL: "a DNS label: lowercase letters, digits and '-', "
    "starting and ending with a letter or digit",
}


def _describe(error: ValidationError, source: str, prefix: tuple[str | int, ...]) -> str:
    problems = []
    for item in error.errors():
        path = _path((*prefix, *item["loc"]))
        message = item["msg"].removeprefix("Value error, ")
        pattern = (item.get("ctx") or {}).get("pattern")
        if pattern in _PATTERN_HELP:
            message = f"expected {_PATTERN_HELP[pattern]}"
        seen = "" if item["type"] == "missing" else f" (got {item['input']!r})"
        problems.append(f"{source}: {path}: {message}{seen}")
    return "\n".join(problems)


def _path(location: tuple[str | int, ...]) -> str:
    text = ""
    for part in location:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text
