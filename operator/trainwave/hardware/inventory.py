"""A node's inventory, and its annotation: the agent writes it, the operator reads it.

Pure: frozen dataclasses and the JSON document of the trainwave.io/inventory
annotation, both ways. `to_document` is how the agent renders what it found;
`from_document` is how placement and the builders read it back, into the same
types, checking every field: a value of the wrong type raises InventoryError
naming the field, the value seen and what is accepted, instead of surfacing
later as a KeyError deep in a placement round.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, get_args

from trainwave.hardware.pci import GDR_MAX_DISTANCE, Distance

LinkLayer = Literal["IB", "RoCE"]
LINK_LAYERS: tuple[LinkLayer, ...] = get_args(LinkLayer)


class InventoryError(ValueError):
    """An inventory annotation that does not hold what the agent writes."""


@dataclass(frozen=True, slots=True)
class GpuInfo:
    index: int
    uuid: str
    product: str
    memory_mib: int
    pci_bus_id: str  # sysfs spelling: 0000:18:00.0
    numa_node: int | None
    pci_path: str | None = None  # under /sys/devices; known to the agent, not published


@dataclass(frozen=True, slots=True)
class NicInfo:
    """One port of one RDMA device (`mlx5_0` port 1)."""

    name: str
    port: int
    state: str  # ACTIVE, DOWN, INIT, ARMED, ...
    link_layer: LinkLayer
    rate_gbps: float
    pci_path: str | None
    numa_node: int | None
    gid_types: tuple[tuple[int, str], ...] = ()  # (gid index, "RoCE v2" | "IB/RoCE v1")

    @property
    def hca(self) -> str:
        """The NCCL_IB_HCA spelling."""
        return f"{self.name}:{self.port}"

    @property
    def active(self) -> bool:
        return self.state == "ACTIVE"

    @property
    def roce_v2_gid_indices(self) -> tuple[int, ...]:
        return tuple(index for index, kind in self.gid_types if kind == "RoCE v2")


@dataclass(frozen=True, slots=True)
class GpuNicDistance:
    """The nearest active NIC of one GPU; `nic` (an HCA:port) is None when none is in reach."""

    gpu_index: int
    nic: str | None
    distance: Distance | None

    @property
    def gdr_in_reach(self) -> bool:
        return self.distance is not None and self.distance <= GDR_MAX_DISTANCE


@dataclass(frozen=True, slots=True)
class GdrReadiness:
    """Whether a GPU memory registration path for RDMA exists on the node."""

    possible: bool
    peer_memory: str | None  # the module that provides it: nvidia_peermem, nv_peer_mem
    dmabuf: bool
    reason: str


NO_GDR = GdrReadiness(False, None, False, "not reported")


@dataclass(frozen=True, slots=True)
class NodeInventory:
    gpus: tuple[GpuInfo, ...]
    nvlink_islands: tuple[tuple[int, ...], ...]  # GPU indices; only GPUs with a link
    nics: tuple[NicInfo, ...]
    nearest_nics: tuple[GpuNicDistance, ...]
    gdr: GdrReadiness
    problems: tuple[str, ...] = ()  # what was skipped while reading, and why
    # The GPUs offered for sharing (by index): what the node's shared-GPU-memory
    # resource adds up, so the operator can pin a pod to one of them by UUID.
    shared: tuple[int, ...] = ()

    @property
    def active_nics(self) -> tuple[NicInfo, ...]:
        return tuple(nic for nic in self.nics if nic.active)

    @property
    def shared_gpus(self) -> tuple[GpuInfo, ...]:
        by_index = {gpu.index: gpu for gpu in self.gpus}
        return tuple(by_index[index] for index in self.shared if index in by_index)

    def nearest_by_gpu(self) -> tuple[GpuNicDistance, ...]:
        """Each GPU's nearest NIC, in GPU index order."""
        return tuple(sorted(self.nearest_nics, key=lambda near: near.gpu_index))


def to_document(inventory: NodeInventory) -> dict[str, Any]:
    """The inventory as JSON-ready data, in the camelCase of the Kubernetes API."""
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
            {"index": gpu.index, "uuid": gpu.uuid, "memoryMiB": gpu.memory_mib}
            for gpu in inventory.shared_gpus
        ],
        "problems": list(inventory.problems),
    }


def encode(inventory: NodeInventory) -> str:
    """The annotation value, compact and keys sorted: the same inventory, the same text."""
    return json.dumps(to_document(inventory), separators=(",", ":"), sort_keys=True)


def decode(text: str) -> NodeInventory:
    """The annotation value back to an inventory; raises InventoryError naming the field."""
    try:
        document = json.loads(text)
    except ValueError as error:
        raise InventoryError(f"not JSON ({error})") from None
    return from_document(document)


def from_document(document: object) -> NodeInventory:
    """Read what `to_document` wrote. Fields a newer agent adds are ignored; fields an
    older one lacks take their empty value, so agents and operators upgrade apart."""
    top = _Reader(document, "")
    gpus = tuple(_gpu(item) for item in top.items("gpus"))
    known = {gpu.index for gpu in gpus}
    shared = tuple(item.integer("index") for item in top.items("sharedGpus"))
    stray = [index for index in shared if index not in known]
    if stray:
        raise InventoryError(
            f"sharedGpus: GPU index(es) {stray} are not among gpus[].index {sorted(known)}"
        )
    islands = tuple(
        tuple(
            _as(int, value, f"nvlinkIslands[{i}][{j}]", "an integer")
            for j, value in enumerate(
                _as(list, island, f"nvlinkIslands[{i}]", "a list of GPU indexes")
            )
        )
        for i, island in enumerate(top.array("nvlinkIslands"))
    )
    nearest = tuple(_nearest(key, reader) for key, reader in top.mapping("nearestNic").items())
    gdr = top.optional_object("gdr")
    return NodeInventory(
        gpus=gpus,
        nvlink_islands=islands,
        nics=tuple(_nic(item) for item in top.items("nics")),
        nearest_nics=nearest,
        gdr=NO_GDR
        if gdr is None
        else GdrReadiness(
            possible=gdr.flag("possible"),
            peer_memory=gdr.optional_text("peerMemory"),
            dmabuf=gdr.flag("dmabuf"),
            reason=gdr.optional_text("reason") or "",
        ),
        problems=tuple(
            _as(str, value, f"problems[{i}]", "a string")
            for i, value in enumerate(top.array("problems"))
        ),
        shared=shared,
    )


def _gpu(item: _Reader) -> GpuInfo:
    return GpuInfo(
        index=item.integer("index"),
        uuid=item.text("uuid"),
        product=sys.intern(item.optional_text("product") or ""),
        memory_mib=item.integer("memoryMiB"),
        pci_bus_id=sys.intern(item.optional_text("pciBusId") or ""),
        numa_node=item.optional_integer("numaNode"),
    )


def _nic(item: _Reader) -> NicInfo:
    hca = item.text("hca")
    name, sep, port = hca.rpartition(":")
    if not sep or not name or not port.isdigit():
        raise InventoryError(f"{item.where}hca: {hca!r}, expected <device>:<port> like mlx5_0:1")
    layer = item.text("linkLayer")
    if layer not in LINK_LAYERS:
        raise InventoryError(f"{item.where}linkLayer: {layer!r}, expected one of {LINK_LAYERS}")
    gids = item.mapping("gidTypes")
    return _shared(
        NicInfo(
            name=name,
            port=int(port),
            state=item.text("state"),
            link_layer=layer,
            rate_gbps=item.number("rateGbps"),
            pci_path=item.optional_text("pciPath"),
            numa_node=item.optional_integer("numaNode"),
            gid_types=tuple(
                sorted(
                    (_index(key, reader.where), reader.whole_text()) for key, reader in gids.items()
                )
            ),
        )
    )


def _nearest(key: str, item: _Reader) -> GpuNicDistance:
    raw = item.optional_text("distance")
    if raw is not None and raw not in Distance.__members__:
        raise InventoryError(
            f"{item.where}distance: {raw!r}, expected one of {list(Distance.__members__)}"
        )
    return _shared(
        GpuNicDistance(
            gpu_index=_index(key, item.where),
            nic=item.optional_text("hca"),
            distance=Distance[raw] if raw is not None else None,
        )
    )


V = TypeVar("V")
_SHARED: dict[Any, Any] = {}
_SHARED_MAX = 4096  # distinct values kept; more than any fleet has NIC layouts


def _shared(value: V) -> V:
    """One instance per distinct value: the operator reads every node's inventory, and
    nodes of one model have equal NICs and GPU-NIC distances (only GPU UUIDs differ), so
    a 1,024-node fleet keeps a few dozen of these, not tens of thousands. Frozen values
    only; a race between threads at worst keeps two equal copies."""
    found = _SHARED.get(value)
    if found is None:
        if len(_SHARED) >= _SHARED_MAX:
            _SHARED.clear()
        _SHARED[value] = found = value
    return found


def _index(key: str, where: str) -> int:
    if not key.isdigit():
        raise InventoryError(f"{where.rstrip('.')}: key {key!r}, expected an index")
    return int(key)


T = TypeVar("T")


def _as(kind: type[T], value: object, where: str, expected: str) -> T:
    # bool is an int in Python; a JSON `true` is never a count or an index.
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise InventoryError(f"{where}: {value!r}, expected {expected}")
    return value


class _Reader:
    """One JSON object of the document and where it sits (`nics[2].`), for error messages."""

    def __init__(self, value: object, where: str) -> None:
        self.value = value
        self.where = where

    def _object(self) -> Mapping[str, Any]:
        return _as(dict, self.value, self.where.rstrip(".") or "inventory", "an object")

    def _get(self, key: str, kind: type[T], expected: str, default: T | None = None) -> T:
        value = self._object().get(key, default)
        return _as(kind, value, f"{self.where}{key}", expected)

    def integer(self, key: str) -> int:
        return self._get(key, int, "an integer")

    def text(self, key: str) -> str:
        return self._get(key, str, "a string")

    def flag(self, key: str) -> bool:
        return self._get(key, bool, "true or false", default=False)

    def number(self, key: str) -> float:
        value = self._object().get(key, 0)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InventoryError(f"{self.where}{key}: {value!r}, expected a number")
        return float(value)

    def optional_integer(self, key: str) -> int | None:
        return None if self._object().get(key) is None else self.integer(key)

    def optional_text(self, key: str) -> str | None:
        return None if self._object().get(key) is None else self.text(key)

    def whole_text(self) -> str:
        return _as(str, self.value, self.where.rstrip("."), "a string")

    def array(self, key: str) -> list[Any]:
        return self._get(key, list, "a list", default=[])

    def items(self, key: str) -> list[_Reader]:
        return [_Reader(item, f"{self.where}{key}[{i}].") for i, item in enumerate(self.array(key))]

    def mapping(self, key: str) -> dict[str, _Reader]:
        found = self._get(key, dict, "an object", default={})
        return {str(k): _Reader(v, f"{self.where}{key}.{k}.") for k, v in found.items()}

    def optional_object(self, key: str) -> _Reader | None:
        value = self._object().get(key)
        return None if value is None else _Reader(value, f"{self.where}{key}.")


__all__ = [
    "GDR_MAX_DISTANCE",
    "Distance",
    "GdrReadiness",
    "GpuInfo",
    "GpuNicDistance",
    "InventoryError",
    "LinkLayer",
    "NicInfo",
    "NodeInventory",
    "decode",
    "encode",
    "from_document",
    "to_document",
]
