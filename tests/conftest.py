"""Test tiers: every test is marked with the tier its directory names.

    unit         in-process logic, no cluster (tests/unit)                `make unit`
    host         programs run on this machine, no cluster: helm and tsc on the
                 chart, torch process groups on loopback, the launcher and its
                 workers, the arbiter (tests/host)                         `make host`
    integration  the real local control plane, kwok nodes (tests/integration)
    e2e          the chart installed for real on a real kubelet + containerd node (tests/e2e)
    chaos        seeded faults while jobs run (tests/chaos)

The markers are registered in pyproject.toml; `pytest -m unit` (or `-m "not chaos"`)
picks tiers by marker. The integration, e2e and chaos tiers each bring up trainwave
in their own way (an operator process, a helm release on the real node, the chaos
harness), so one pytest session may hold at most one of them: two would start two
operators on one cluster. Such a session is refused at collection with the reason,
instead of failing later in ways that are hard to read. unit and host start no
operator and may share a session with any tier.
"""

from __future__ import annotations

from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
TIERS = ("unit", "host", "integration", "e2e", "chaos")
# Tiers that start trainwave themselves; at most one of them per session.
OPERATOR_TIERS = frozenset({"integration", "e2e", "chaos"})


def tier_of(path: Path) -> str | None:
    """The tier a test file belongs to: the first directory under tests/, if it is one."""
    try:
        top = path.resolve().relative_to(TESTS).parts[0]
    except (ValueError, IndexError):
        return None
    return top if top in TIERS else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    misplaced: list[str] = []
    for item in items:
        tier = tier_of(Path(str(item.path)))
        if tier is None:
            continue
        # The directory decides: a test marked with another tier would be picked by the
        # wrong `-m` and could bring two operator tiers into one session.
        others = sorted({mark.name for mark in item.iter_markers()} & set(TIERS) - {tier})
        if others:
            misplaced.append(f"{item.nodeid} is in tests/{tier} but marked {', '.join(others)}")
        item.add_marker(getattr(pytest.mark, tier))
    if misplaced:
        raise pytest.UsageError(
            "a test's tier is the directory it is in (tests/conftest.py); remove the marks: "
            + "; ".join(misplaced[:5])
        )


def pytest_collection_finish(session: pytest.Session) -> None:
    # After `-m`/`-k` deselection: `pytest -m unit` collects every tier, then keeps one.
    seen = {tier_of(Path(str(item.path))) for item in session.items}
    clashing = sorted(tier for tier in seen if tier in OPERATOR_TIERS)
    if len(clashing) > 1:
        raise pytest.UsageError(
            f"this session holds the tiers {', '.join(clashing)}: each starts trainwave its own "
            "way, so run them in separate pytest sessions (as `make test` does)"
        )
