"""The shared GPUs as DRA ResourceSlices (resource.k8s.io/v1), and what to change to get them. Pure.

The agent is the DRA driver `gpu.trainwave.io` for the GPUs it shares: one
ResourceSlice per GPU, each with one device that allows several allocations
and offers the GPU's memory as consumable capacity. kube-scheduler then
accounts the memory of each GPU on its own, claim by claim, instead of the
node-wide sum of trainwave.io/gpu-memory.

One device per slice is not a style choice: kube-scheduler v1.34.4 skips the
other shareable devices of a slice once the first cannot fit a request
(kubernetes/kubernetes#133705; the fix is not in 1.34.4). Device capacity
needs the alpha DRAConsumableCapacity feature gate on kube-apiserver and
kube-scheduler; without it the API server silently drops
`allowMultipleAllocations`, which `publishing.py` checks after each write.

Each slice is owned by its Node, as the kubelet plugin helper does it, so the
garbage collector removes the slices of a node that is deleted.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trainwave import contract
from trainwave.hardware.inventory import GpuInfo

API_VERSION = "resource.k8s.io/v1"
MIB = 1024**2
# The smallest share a claim can take, and the step shares round up to: 1 MiB,
# the unit of trainwave.io/gpu-memory, so both accountings agree on a request.
SHARE_STEP = "1Mi"


@dataclass(frozen=True)
class NodeRef:
    name: str
    uid: str


def slice_name(node: str, gpu: GpuInfo) -> str:
    return f"{node}-{contract.DRA_DEVICE_PREFIX}{gpu.index}"


def device_name(gpu: GpuInfo) -> str:
    return f"{contract.DRA_DEVICE_PREFIX}{gpu.index}"


def build_slices(node: NodeRef, shared: Sequence[GpuInfo], generation: int) -> list[dict[str, Any]]:
    """One slice per shared GPU, all in the pool named after the node."""
    return [
        {
            "apiVersion": API_VERSION,
            "kind": "ResourceSlice",
            "metadata": {
                "name": slice_name(node.name, gpu),
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Node", "name": node.name, "uid": node.uid}
                ],
            },
            "spec": {
                "driver": contract.DRA_DRIVER,
                "nodeName": node.name,
                "pool": {
                    "name": node.name,
                    "generation": generation,
                    "resourceSliceCount": len(shared),
                },
                "devices": [_device(gpu)],
            },
        }
        for gpu in shared
    ]


def memory_quantity(mib: int) -> str:
    """`mib` MiB in the canonical form kube-apiserver stores (the largest binary suffix
    that keeps an integer: 40960Mi is stored as 40Gi). A slice is compared with what the
    server returns, so any other spelling made every pass rewrite the pool at a new
    generation: seen on the real node with 40960 MiB GPUs (A100 40GB; 80GB ones are
    81920 MiB, 80Gi)."""
    value, suffixes = mib, ("Mi", "Gi", "Ti", "Pi", "Ei")
    index = 0
    while value and value % 1024 == 0 and index < len(suffixes) - 1:
        value //= 1024
        index += 1
    return f"{value}{suffixes[index]}"


def _device(gpu: GpuInfo) -> dict[str, Any]:
    memory = memory_quantity(gpu.memory_mib)
    return {
        "name": device_name(gpu),
        "allowMultipleAllocations": True,
        "attributes": {
            contract.DRA_ATTRIBUTE_UUID: {"string": gpu.uuid},
            contract.DRA_ATTRIBUTE_INDEX: {"int": gpu.index},
            contract.DRA_ATTRIBUTE_PRODUCT: {"string": gpu.product or "unknown"},
        },
        "capacity": {
            contract.DRA_CAPACITY_MEMORY: {
                "value": memory,
                # A claim without a memory request takes the whole GPU.
                "requestPolicy": {
                    "default": memory,
                    "validRange": {"min": SHARE_STEP, "step": SHARE_STEP},
                },
            }
        },
    }


@dataclass(frozen=True)
class SlicePlan:
    """What to send: slices to create or replace (with the pool's next generation), names to
    delete. Empty when what is published already matches."""

    write: tuple[dict[str, Any], ...] = ()
    delete: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.write or self.delete)


def plan_slices(
    node: NodeRef, shared: Sequence[GpuInfo], published: Iterable[Mapping[str, Any]]
) -> SlicePlan:
    """Compare the node's published slices of our driver with the shared GPUs.

    Any difference rewrites every slice of the pool with a higher generation:
    kube-scheduler uses only the slices of a pool's newest generation, so a
    half-updated pool is never read as a mix of old and new devices.
    """
    current = {str(s["metadata"]["name"]): s for s in published}
    generations = [int(s["spec"]["pool"].get("generation") or 0) for s in current.values()]
    now = max(generations, default=0)
    wanted = {str(s["metadata"]["name"]): s for s in build_slices(node, shared, now)}
    stale = tuple(sorted(current.keys() - wanted.keys()))
    same = not stale and all(
        name in current and _published_as(current[name], desired)
        for name, desired in wanted.items()
    )
    if same:
        return SlicePlan()
    rewritten = build_slices(node, shared, now + 1)
    for desired in rewritten:
        existing = current.get(str(desired["metadata"]["name"]))
        if existing is not None:
            desired["metadata"]["resourceVersion"] = existing["metadata"]["resourceVersion"]
    return SlicePlan(write=tuple(rewritten), delete=stale)


def _published_as(existing: Mapping[str, Any], desired: Mapping[str, Any]) -> bool:
    owners = existing["metadata"].get("ownerReferences") or []
    return bool(existing.get("spec") == desired["spec"]) and any(
        o.get("uid") == desired["metadata"]["ownerReferences"][0]["uid"] for o in owners
    )


def gate_problem(stored: Mapping[str, Any]) -> str | None:
    """Why a slice the API server stored cannot share its GPU, or None when it can."""
    for device in (stored.get("spec") or {}).get("devices") or []:
        if not device.get("allowMultipleAllocations"):
            return (
                f"ResourceSlice {stored['metadata']['name']}: kube-apiserver dropped "
                "allowMultipleAllocations from device "
                f"{device.get('name')}: turn on the DRAConsumableCapacity feature gate on "
                "kube-apiserver and kube-scheduler, or run the agent without --gpu-slices"
            )
    return None
