"""One pytest session may collect several tiers (`make test` runs unit, host and
integration together; `pytest -m unit` from the root collects every tier, then keeps
one). Without packages (no __init__.py), two modules with one basename cannot both be
imported: a clash of test modules stops the whole session at collection, and a clash of
helper modules lets the first on sys.path shadow the other. tests/conftest.py refuses a
session holding two operator tiers, and a test marked with a tier not its directory's."""

from __future__ import annotations

import importlib.util
from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def tiers() -> tuple[str, ...]:
    """TIERS of tests/conftest.py, loaded under a name of its own (pytest has already
    imported it as a conftest)."""
    spec = importlib.util.spec_from_file_location("tiers_conftest", TESTS / "conftest.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return tuple(module.TIERS)


def test_modules_of_every_tier_have_distinct_names() -> None:
    names = Counter(
        path.name
        for tier in tiers()
        for path in (TESTS / tier).rglob("*.py")
        if path.name != "conftest.py"  # pytest loads each conftest by its path
    )
    assert [name for name, count in names.items() if count > 1] == []


def test_every_test_directory_is_a_tier() -> None:
    """A new directory of tests gets no tier marker and no place in `make test` unless
    it is listed in tests/conftest.py (and the Makefile)."""
    with_tests = {path.relative_to(TESTS).parts[0] for path in TESTS.rglob("test_*.py")}
    assert with_tests - {"benchmarks"} <= set(tiers())
