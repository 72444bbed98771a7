"""Test tiers: every test is marked with the tier its directory names.

    unit         pure logic, no cluster (tests/unit)                     `make unit`
    integration  the real local control plane, kwok nodes (tests/integration)
    e2e          the chart installed for real on a real kubelet + containerd node (tests/e2e)
    chaos        seeded faults while jobs run (tests/chaos)

`pytest -m unit` (or `-m "not chaos"`) picks tiers by marker. The integration,
e2e and chaos tiers each bring up trainwave in their own way (an operator
process, a helm release on the real node, the chaos harness), so one pytest
session may hold at most one of them: two would start two operators on one
cluster. Such a session is refused at collection with the reason, instead of
failing later in ways that are hard to read.
"""

from __future__ import annotations

from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
TIERS = ("unit", "integration", "e2e", "chaos")
# Tiers that start trainwave themselves; at most one of them per session.
OPERATOR_TIERS = frozenset({"integration", "e2e", "chaos"})


def tier_of(path: Path) -> str | None:
    """The tier a test file belongs to: the first directory under tests/, if it is one."""
    try:
        top = path.resolve().relative_to(TESTS).parts[0]
    except (ValueError, IndexError):
        return None
    return top if top in TIERS else None


def pytest_configure(config: pytest.Config) -> None:
    for tier in TIERS:
        config.addinivalue_line(
            "markers", f"{tier}: the {tier} tier (tests/{tier}; tests/conftest.py)"
        )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    seen: set[str] = set()
    for item in items:
        tier = tier_of(Path(str(item.path)))
        if tier is None:
            continue
        item.add_marker(getattr(pytest.mark, tier))
        seen.add(tier)
    clashing = sorted(seen & OPERATOR_TIERS)
    if len(clashing) > 1:
        raise pytest.UsageError(
            f"this session holds the tiers {', '.join(clashing)}: each starts trainwave its own "
            "way, so run them in separate pytest sessions (as `make test` does)"
        )
