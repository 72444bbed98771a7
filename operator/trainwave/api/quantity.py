"""Kubernetes resource quantities ("250m", "16Gi", "1e3", 8), read as the API server reads them.

Pure.

The one parser of quantities in trainwave: placement counts node and pod resources
with it, the API reads `gpuSharing.memory` with it, and the agent compares the
capacities the API server canonicalised with it. It mirrors apimachinery's
`ParseQuantity` (k8s.io/apimachinery v0.34.4, pkg/api/resource/quantity.go, with the
suffixes of suffix.go):

    <quantity>        ::= <signedNumber><suffix>
    <signedNumber>    ::= <number> | <sign><number>
    <number>          ::= <digits> | <digits>.<digits> | <digits>. | .<digits>
    <suffix>          ::= <binarySI> | <decimalExponent> | <decimalSI>
    <binarySI>        ::= Ki | Mi | Gi | Ti | Pi | Ei
    <decimalSI>       ::= n | u | m | "" | k | M | G | T | P | E
    <decimalExponent> ::= "e" <signedNumber> | "E" <signedNumber>   (the exponent an integer)

and its rounding: a non-zero value is rounded up (away from zero) to a whole nano
(0.1n is 1n), and a binary-suffixed value is capped at 2^63-1. Like the API server,
it refuses surrounding whitespace, "1K" (kilo is "k") and a fraction in the exponent.
The value is exact (a Decimal, never a float); what a caller counts in (kube-scheduler's
`Value()` rounds up to an integer, `MilliValue()` counts thousandths) is the caller's.
"""

from __future__ import annotations

import decimal
from decimal import Decimal
from typing import Final

_BINARY: Final = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}  # powers of 2
_DECIMAL: Final = {
    "n": -9,
    "u": -6,
    "m": -3,
    "": 0,
    "k": 3,
    "M": 6,
    "G": 9,
    "T": 12,
    "P": 15,
    "E": 18,
}
# The characters quantity.go's parseQuantityString takes into a suffix, before an
# exponent's sign and digits.
_SUFFIX_CHARS: Final = frozenset("eEinumkKMGTP")
_DIGITS: Final = frozenset("0123456789")
_NANO: Final = Decimal("1e-9")
_MAX_BINARY: Final = Decimal(2**63 - 1)
# Exact arithmetic: the largest binary quantity the cap admits has 19 digits before
# rounding to nanos adds 9; a wide context keeps every product exact.
_EXACT: Final = decimal.Context(prec=200, rounding=decimal.ROUND_UP, Emax=10**6, Emin=-(10**6))

ACCEPTED: Final = (
    "a Kubernetes quantity: a number, optionally signed and with a fraction, and a suffix "
    "Ki, Mi, Gi, Ti, Pi, Ei (powers of 1024), n, u, m, k, M, G, T, P, E (powers of 1000) "
    "or an exponent such as e3 (e.g. 500m, 20Gi, 1.5, 8)"
)


class BadQuantity(ValueError):
    """A value the API server would not accept as a quantity."""


def parse_quantity(value: object) -> Decimal:
    """'250m' -> 0.25, '1Gi' -> 1073741824, '1e3' -> 1000, 8 -> 8.

    JSON numbers (int or float, not bool) read as their text, as int-or-string fields
    allow. Raises BadQuantity naming the value and what is accepted otherwise.
    """
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise BadQuantity(f"{value!r} is not a quantity; accepted: {ACCEPTED}")
    text = str(value)
    parsed = _parse(text)
    if parsed is None:
        raise BadQuantity(f"{text!r} is not a quantity; accepted: {ACCEPTED}")
    return parsed


def _parse(text: str) -> Decimal | None:
    if not text:
        return None
    negative = text[0] == "-"
    position = 1 if text[0] in "+-" else 0
    integer, position = _digits(text, position)
    fraction = ""
    if text[position : position + 1] == ".":
        fraction, position = _digits(text, position + 1)
    suffix_start = position
    while position < len(text) and text[position] in _SUFFIX_CHARS:
        position += 1
    if text[position : position + 1] in ("+", "-"):
        position += 1
    _, position = _digits(text, position)
    if position != len(text):
        return None  # quantity.go's ErrFormatWrong: text after the suffix
    scale = _scale(text[suffix_start:])
    if scale is None:
        return None  # ErrSuffix
    base, exponent = scale
    # "-", "." and "Gi" alone parse as 0 in quantity.go (an empty number is 0); so here.
    amount = Decimal(f"{integer or '0'}.{fraction or '0'}")
    try:
        amount = _EXACT.multiply(amount, _EXACT.power(base, exponent))
        if amount and int(amount.as_tuple().exponent) < -9:
            amount = amount.quantize(_NANO, context=_EXACT)  # ROUND_UP: 0.1n is 1n
    except decimal.DecimalException:
        return None  # an exponent beyond +-10^6 (quantity.go would wrap it at int32)
    if base == 2 and amount > _MAX_BINARY:
        amount = _MAX_BINARY
    return -amount if negative else amount


def _digits(text: str, position: int) -> tuple[str, int]:
    start = position
    while position < len(text) and text[position] in _DIGITS:
        position += 1
    return text[start:position], position


def _scale(suffix: str) -> tuple[int, int] | None:
    """(base, exponent) of a suffix, as suffix.go's interpret: the tables first, so "E" is
    exa and "E3" an exponent."""
    if suffix in _DECIMAL:
        return 10, _DECIMAL[suffix]
    if suffix in _BINARY:
        return 2, _BINARY[suffix]
    if len(suffix) > 1 and suffix[0] in "eE":
        exponent = suffix[1:]
        digits = exponent[1:] if exponent[0] in "+-" else exponent
        if digits and set(digits) <= _DIGITS:
            return 10, int(exponent)
    return None
