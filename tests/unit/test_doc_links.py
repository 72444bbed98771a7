"""Every relative link in README.md and docs/ leads somewhere: the file exists and, when the
link names a heading, the page has it. Pages move (docs/benchmarks was one page, now a
directory); a link left behind is a sentence that points at nothing."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from test_reference_docs import load_generator

REPO = Path(__file__).resolve().parents[2]
PAGES = sorted([REPO / "README.md", *(REPO / "docs").rglob("*.md")])
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
CODE = re.compile(r"`[^`\n]*`")  # a regex in an inline code span is not a link


ANCHOR = load_generator().anchor  # GitHub's id for a heading, as the reference writes it


def anchors(page: Path) -> set[str]:
    found: set[str] = set()
    for line in FENCE.sub("", page.read_text()).splitlines():
        if line.startswith("#"):
            base = ANCHOR(line.lstrip("#").strip())
            anchor, n = base, 0
            while anchor in found:  # GitHub numbers repeated headings
                n += 1
                anchor = f"{base}-{n}"
            found.add(anchor)
    return found


def links(page: Path) -> list[str]:
    return LINK.findall(CODE.sub("", FENCE.sub("", page.read_text())))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_leads_to_a_file_and_heading(page: Path) -> None:
    broken = []
    for target in links(page):
        if re.match(r"^[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target}: no heading #{anchor} in {resolved.relative_to(REPO)}")
    assert not broken, broken
