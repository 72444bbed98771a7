"""The one quantity parser against apimachinery's own tables.

The rows are those of TestQuantityParse and its invalid list in k8s.io/apimachinery
v0.34.4 pkg/api/resource/quantity_test.go (values written out as exact decimals),
plus the quirks quantity.go has and we keep, and what the callers make of it.
"""

from __future__ import annotations

from decimal import Decimal

import pytest

from trainwave.agent.changes import quantity_value
from trainwave.api.quantity import BadQuantity, parse_quantity
from trainwave.api.sharing import memory_bytes
from trainwave.placement.quantities import amount

pytestmark = pytest.mark.timeout(10)

MAX_INT64 = 2**63 - 1

PARSED = {
    # zero with every kind of suffix
    "0": 0, "0n": 0, "0u": 0, "0m": 0, "0Ki": 0, "0k": 0, "0Mi": 0, "0M": 0, "0Gi": 0,
    "0G": 0, "0Ti": 0, "0T": 0,
    # binary suffixes
    "1": 1, "1Ki": 1024, "8Ki": 8 * 1024, "7Mi": 7 * 2**20, "6Gi": 6 * 2**30, "5Ti": 5 * 2**40,
    "4Pi": 4 * 2**50, "3Ei": 3 * 2**60, "100Ti": 100 * 2**40,
    # decimal suffixes
    "5n": "5e-9", "4u": "4e-6", "3m": "0.003", "9": 9, "8k": 8000, "50k": 50000, "7M": 7 * 10**6,
    "6G": 6 * 10**9, "5T": 5 * 10**12, "300T": 300 * 10**12, "2P": 2 * 10**15, "1E": 10**18,
    # exponents ("E" alone is exa, "E" with digits an exponent)
    "1E-3": "0.001", "1e3": 1000, "1E6": 10**6, "1e9": 10**9, "1E18": 10**18,
    # fractions
    "100.035k": 100035, "0.001": "0.001", "0.0005k": "0.5", "0.00500": "0.005", "0.5e0": "0.5",
    "0.5e-2": "0.005", "10.035M": 10035000, "1.2e3": 1200, "1.3E+6": 1300000,
    "1.53E12": 1530000000000, "9.01": "9.01", "8.1k": 8100, "6.987654321G": 6987654321,
    "2.5P": 25 * 10**14, "1.01E": 101 * 10**16, "12E": 12 * 10**18,
    # rounded up to a whole nano, away from zero
    "3.001n": "4e-9", "1.1E-9": "2e-9", "0.0000000001": "1e-9", "0.5e-9": "1e-9",
    "0.9n": "1e-9", "0.00000012345": "124e-9", "0.00000012354": "124e-9",
    # binary values: capped at 2^63-1; a fraction kept exactly
    "9Ei": MAX_INT64, "9223372036854775807Ki": MAX_INT64, "100.035Ki": "102435.84",
    "0.5Mi": 2**19, "0.05Gi": "53687091.2", "0.000000000001Ki": "2e-9",
    # numbers without digits on one side of the point
    ".001": "0.001", ".0001k": "0.1", "1.": 1, "1.G": 10**9,
    # signs
    "-1": -1, "+1": 1, "-1.5Gi": -1610612736, "-3.001n": "-4e-9",
    # quantity.go's quirks: an empty number is 0
    "-": 0, ".": 0, "Gi": 0, "e3": 0,
}  # fmt: skip

REFUSED = [
    # quantity_test.go's invalid list
    "1.1.M", "1+1.0M", "0.1mi", "0.1am", "aoeu", ".5i", "1i", "-3.01i", "-3.01e-",
    " 1", "1 ",
    # and more that ParseQuantity refuses
    "", "1K", "1k8", "1e1.5", "1Gi1", "1E+", "e", "1ki", "1.5.5",
]  # fmt: skip


@pytest.mark.parametrize(("text", "value"), PARSED.items(), ids=PARSED.keys())
def test_parses_as_apimachinery_does(text: str, value: int | str) -> None:
    assert parse_quantity(text) == Decimal(value)


@pytest.mark.parametrize("text", REFUSED, ids=[repr(t) for t in REFUSED])
def test_refuses_what_apimachinery_refuses_naming_the_value_and_what_is_accepted(
    text: str,
) -> None:
    with pytest.raises(BadQuantity, match=r"is not a quantity; accepted: a Kubernetes quantity"):
        parse_quantity(text)


NUMBERS = {"int": (8, 8), "negative": (-2, -2), "float": (1.5, "1.5"), "big float": (1e20, 10**20)}


@pytest.mark.parametrize(("value", "expected"), NUMBERS.values(), ids=NUMBERS.keys())
def test_json_numbers_read_as_their_text(value: float, expected: int | str) -> None:
    assert parse_quantity(value) == Decimal(expected)


@pytest.mark.parametrize("value", [True, None, [1], {"a": 1}], ids=repr)
def test_other_json_is_refused(value: object) -> None:
    with pytest.raises(BadQuantity):
        parse_quantity(value)


def test_an_exponent_too_large_to_hold_is_refused_not_an_arithmetic_error() -> None:
    with pytest.raises(BadQuantity):
        parse_quantity("1e10000000")


# --- what each caller counts in ---------------------------------------------------------


CALLERS = {
    # kube-scheduler: cpu in millicores, the rest rounded up to an integer, never negative
    "cpu milli": (amount("cpu", "250m"), 250),
    "cpu cores": (amount("cpu", "2"), 2000),
    "cpu fraction of a milli": (amount("cpu", "0.1m"), 1),
    "memory": (amount("memory", "1Gi"), 2**30),
    "memory fraction": (amount("memory", "1.5"), 2),
    "negative": (amount("memory", "-1"), 0),
    # the agent: integers however the API server wrote them, None otherwise
    "agent kilo": (quantity_value("81k"), 81000),
    "agent exponent": (quantity_value("1e3"), 1000),
    "agent fraction": (quantity_value("500m"), None),
    "agent bad": (quantity_value("81 k"), None),
    # gpuSharing.memory: bytes, a fraction rounded up
    "memory bytes": (memory_bytes("20Gi"), 20 * 2**30),
    "memory bytes int": (memory_bytes(1048576), 2**20),
    "memory bytes fraction": (memory_bytes("0.5Ki"), 512),
    "memory bytes round up": (memory_bytes("1.5"), 2),
}


@pytest.mark.parametrize(("got", "expected"), CALLERS.values(), ids=CALLERS.keys())
def test_each_caller_counts_in_its_unit(got: int | None, expected: int | None) -> None:
    assert got == expected


@pytest.mark.parametrize("value", ["-1Gi", "20 gigs", "1K"])
def test_memory_refuses_negative_and_bad_quantities_saying_what_is_accepted(value: str) -> None:
    with pytest.raises(ValueError, match=r"not a memory quantity; accepted: .*suffix Ki, Mi, Gi"):
        memory_bytes(value)
