"""Every reason trainwave writes comes from api/reasons.py: no decision spells one inline.

The check reads the lifecycle and placer sources: wherever a reason is passed to
the calls that write it (a phase, a condition, an Event, a failure), the argument
must not be a string literal.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from trainwave.api.reasons import Reason

OPERATOR = Path(__file__).resolve().parents[2] / "operator" / "trainwave"
# call name -> position of its reason argument
REASON_ARGUMENT = {"enter": 1, "condition": 2, "clear": 1, "fail": 1, "complete": 2, "JobEvent": 1}
SOURCES = [*sorted((OPERATOR / "lifecycle").glob("*.py")), OPERATOR / "controller" / "placer.py"]


def _name(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.name)
def test_reasons_are_never_spelled_inline(source: Path) -> None:
    inline = []
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, ast.Call) and _name(node) in REASON_ARGUMENT:
            position = REASON_ARGUMENT[_name(node)]
            if len(node.args) > position:
                argument = node.args[position]
                if isinstance(argument, ast.Constant) and isinstance(argument.value, str):
                    inline.append(f"line {node.lineno}: {argument.value!r}")
    assert not inline, f"{source.name} spells reasons inline: {inline}"


def test_reasons_are_unique_camel_case_words() -> None:
    values = [r.value for r in Reason]
    assert len(values) == len(set(values))
    for value in values:
        assert value.isalnum(), value
        assert value[0].isupper(), value
