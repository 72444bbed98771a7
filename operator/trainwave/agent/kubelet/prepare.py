"""What the kubelet gets for a claim: the allocated devices of our driver, as CDI ids. Pure.

kube-scheduler allocated the claim (status.allocation); preparing only reads
that result back, checks it is this node's and names each device's CDI id,
which the container runtime resolves through the agent's CDI spec (cdi.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trainwave import contract
from trainwave.agent.kubelet.gen.dra_v1_pb2 import Claim, Device
from trainwave.agent.kubelet.gen.dra_v1_pb2 import NodePrepareResourceResponse as Prepared


def cdi_id(device: str) -> str:
    return f"{contract.CDI_KIND}={device}"


def prepare_claim(claim: Claim, stored: Mapping[str, Any] | None, node: str) -> Prepared:
    """The devices of `stored` (the ResourceClaim as the API server has it) for the kubelet of
    `node`; an error naming the claim and what is wrong otherwise."""
    what = f"ResourceClaim {claim.namespace}/{claim.name}"
    if stored is None:
        return Prepared(error=f"{what} not found")
    uid = (stored.get("metadata") or {}).get("uid")
    if uid != claim.uid:
        return Prepared(error=f"{what} has UID {uid}, the kubelet asked for {claim.uid}")
    allocation = (stored.get("status") or {}).get("allocation") or {}
    results = [
        r
        for r in (allocation.get("devices") or {}).get("results") or []
        if r.get("driver") == contract.DRA_DRIVER
    ]
    if not results:
        return Prepared(error=f"{what} has no device of driver {contract.DRA_DRIVER} allocated")
    elsewhere = sorted({str(r.get("pool")) for r in results if r.get("pool") != node})
    if elsewhere:
        return Prepared(error=f"{what} is allocated on pool(s) {elsewhere}, not on node {node}")
    return Prepared(
        devices=[
            Device(
                request_names=[str(r["request"])],
                pool_name=str(r["pool"]),
                device_name=str(r["device"]),
                cdi_device_ids=[cdi_id(str(r["device"]))],
            )
            for r in results
        ]
    )
