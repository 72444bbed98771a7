"""Checks and the doctor's report: one PASS/WARN/FAIL/SKIP line per item, one verdict."""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


class Status(enum.Enum):
    PASS = "PASS"
    WARN = "WARN"  # works, but slower than it should or not proven
    FAIL = "FAIL"  # broken: training will fail or fall back to TCP
    SKIP = "SKIP"  # does not apply here (no GPU, no RDMA expected)


# The verdict is the worst status; SKIP never makes it worse than PASS.
_SEVERITY = {Status.SKIP: 0, Status.PASS: 0, Status.WARN: 1, Status.FAIL: 2}


@dataclass(frozen=True)
class Check:
    """One item of the checklist and why it came out as it did."""

    name: str
    status: Status
    reason: str
    details: Mapping[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        result: dict[str, Any] = {"name": self.name, "status": self.status.value}
        result["reason"] = self.reason
        if self.details:
            result["details"] = dict(self.details)
        return result


def passed(name: str, reason: str, **details: Any) -> Check:
    return Check(name, Status.PASS, reason, details)


def warned(name: str, reason: str, **details: Any) -> Check:
    return Check(name, Status.WARN, reason, details)


def failed(name: str, reason: str, **details: Any) -> Check:
    return Check(name, Status.FAIL, reason, details)


def skipped(name: str, reason: str, **details: Any) -> Check:
    return Check(name, Status.SKIP, reason, details)


@dataclass(frozen=True)
class DoctorReport:
    checks: tuple[Check, ...]

    @classmethod
    def of(cls, checks: Iterable[Check]) -> DoctorReport:
        return cls(tuple(checks))

    @property
    def verdict(self) -> Status:
        worst = max((_SEVERITY[check.status] for check in self.checks), default=0)
        return {0: Status.PASS, 1: Status.WARN, 2: Status.FAIL}[worst]

    def check(self, name: str) -> Check:
        for check in self.checks:
            if check.name == name:
                return check
        raise KeyError(f"no check named {name!r}; have {[c.name for c in self.checks]}")

    def as_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict.value,
            "checks": [check.as_dict() for check in self.checks],
        }

    def render(self) -> str:
        """Human-readable: one line per check, the verdict last."""
        width = max((len(check.name) for check in self.checks), default=0)
        lines = [
            f"{check.status.value:<4}  {check.name:<{width}}  {check.reason}"
            for check in self.checks
        ]
        lines.append(f"verdict: {self.verdict.value}")
        return "\n".join(lines)
