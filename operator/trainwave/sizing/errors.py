"""The one error sizing raises: which field, what value, what is accepted."""

from __future__ import annotations

from typing import Any


class SizingError(ValueError):
    def __init__(self, field: str, value: Any, accepted: str) -> None:
        super().__init__(f"{field}: got {value!r}; expected {accepted}")
        self.field = field
        self.value = value
        self.accepted = accepted


def require_positive(field: str, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise SizingError(field, value, "an integer >= 1")
