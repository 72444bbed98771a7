"""Kubernetes resource quantities as integers, the way kube-scheduler counts them. Pure.

kube-scheduler's `framework.Resource` keeps CPU in millicores (`MilliValue()`) and
every other resource as `Value()`, which rounds a fraction up (apimachinery
`resource.Quantity.Value`). We do the same so that "fits" here means "fits" there:
`cpu: 250m` is 250, `memory: 1Gi` is 1073741824, `memory: 1.5` is 2. The text is
read by the one quantity parser, api/quantity.py; a bad one raises its BadQuantity.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Final

from trainwave.api.quantity import parse_quantity

CPU: Final = "cpu"
MEMORY: Final = "memory"
EPHEMERAL_STORAGE: Final = "ephemeral-storage"
PODS: Final = "pods"

# A resource vector: resource name -> amount in kube-scheduler's units.
Resources = Mapping[str, int]


def amount(name: str, value: object) -> int:
    """One resource in kube-scheduler's units: millicores for cpu, rounded up."""
    quantity = parse_quantity(value)
    if name == CPU:
        quantity *= 1000
    return max(0, math.ceil(quantity))


def amounts(values: Mapping[str, object] | None) -> dict[str, int]:
    """A resources map ({'cpu': '2', 'memory': '4Gi'}) as a vector; bad values raise."""
    return {name: amount(name, value) for name, value in (values or {}).items()}


def show(name: str, value: int) -> str:
    """A vector entry for people: cpu in cores, bytes in Gi/Mi, the rest as counts."""
    if name == CPU:
        return f"{value // 1000}" if value % 1000 == 0 else f"{value}m"
    if name in (MEMORY, EPHEMERAL_STORAGE) or name.startswith("hugepages-"):
        for suffix, size in (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
            if value >= size:
                shown = value / size
                return f"{shown:.0f}{suffix}" if shown == int(shown) else f"{shown:.1f}{suffix}"
        return str(value)
    return str(value)
