"""`make test` collects tests/unit and tests/integration in one pytest session: without
packages (no __init__.py), two test modules with one basename cannot both be imported and
the whole session stops at collection. Each tier's conftest also refuses another tier's."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_unit_and_integration_test_modules_have_distinct_names() -> None:
    names = Counter(
        path.name for tier in ("unit", "integration") for path in (TESTS / tier).rglob("test_*.py")
    )
    assert [name for name, count in names.items() if count > 1] == []
