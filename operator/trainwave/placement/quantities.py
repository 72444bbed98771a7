"""Kubernetes resource quantities as integers, the way kube-scheduler counts them. Pure.

kube-scheduler's `framework.Resource` keeps CPU in millicores (`MilliValue()`) and
every other resource as `Value()`, which rounds a fraction up (apimachinery
`resource.Quantity.Value`). We do the same so that "fits" here means "fits" there:
`cpu: 250m` is 250, `memory: 1Gi` is 1073741824, `memory: 1.5` is 2.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Final

CPU: Final = "cpu"
MEMORY: Final = "memory"
EPHEMERAL_STORAGE: Final = "ephemeral-storage"
PODS: Final = "pods"

# A resource vector: resource name -> amount in kube-scheduler's units.
Resources = Mapping[str, int]

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
}


class BadQuantity(ValueError):
    """A string the API server would not accept as a quantity."""


def parse_quantity(value: object) -> Decimal:
    """'250m' -> 0.25, '1Gi' -> 1073741824, 8 -> 8; raises BadQuantity otherwise."""
    if isinstance(value, bool):
        raise BadQuantity(f"not a quantity: {value!r}")
    if isinstance(value, int | float):
        return Decimal(str(value))
    text = str(value).strip()
    number, suffix = _split(text)
    try:
        amount = Decimal(number)
    except InvalidOperation:
        raise BadQuantity(f"not a quantity: {value!r}") from None
    if suffix in _BINARY:
        return amount * _BINARY[suffix]
    if suffix in _DECIMAL:
        return amount * _DECIMAL[suffix]
    if suffix[:1] in ("e", "E") and suffix[1:].lstrip("+-").isdigit():
        return amount * (Decimal(10) ** int(suffix[1:]))
    raise BadQuantity(f"not a quantity: {value!r}")


def _split(text: str) -> tuple[str, str]:
    for index, char in enumerate(text):
        if not (char.isdigit() or char in ".+-"):
            # An exponent 'e3' belongs to the suffix, a plain 'E' is exa.
            return text[:index], text[index:]
    return text, ""


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
