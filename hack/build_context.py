"""The build context of the images, as a container builder sees it: which files
.dockerignore leaves in (Docker's matching rules: the last pattern matching the path or one
of its parents decides) and one digest over them, the part of an image's content key that
says its sources changed. Used by hack/images.py."""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterator
from pathlib import Path


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern as a regex over slash-separated relative paths."""
    out = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[" and "]" in pattern[i + 2 :]:
            end = pattern.index("]", i + 2)
            body = pattern[i + 1 : end]
            negated = body[0] in "^!"
            # Ranges (a-z) stay; what would mean something else to `re` is escaped.
            body = re.sub(r"([\\\[\]^&~|])", r"\\\1", body[1:] if negated else body)
            out.append(f"[^/{body}]" if negated else f"(?!/)[{body}]")
            i = end + 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out) + r"\Z")


def ignore_rules(dockerignore: str) -> list[tuple[bool, re.Pattern[str]]]:
    """(negated, regex) per line of a .dockerignore, in order; comments and blanks skipped."""
    rules = []
    for raw in dockerignore.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        pattern = os.path.normpath(line.lstrip("!").strip()).lstrip("/")
        rules.append((negated, _pattern_regex(pattern)))
    return rules


def is_ignored(relpath: str, rules: list[tuple[bool, re.Pattern[str]]]) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parents decides."""
    parts = relpath.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    ignored = False
    for negated, regex in rules:
        if any(regex.match(prefix) for prefix in prefixes):
            ignored = not negated
    return ignored


def context_digest(root: Path) -> bytes:
    """One digest of every file the build context holds, with its path and exec bit."""
    ignore = root / ".dockerignore"
    rules = ignore_rules(ignore.read_text()) if ignore.exists() else []
    digest = hashlib.sha256()
    for path in sorted(_context_files(root, rules)):
        rel = path.relative_to(root).as_posix()
        link = path.is_symlink()
        data = b"link:" + os.readlink(path).encode() if link else path.read_bytes()
        mode = "x" if os.access(path, os.X_OK) and not link else "-"
        digest.update(f"{rel}\0{mode}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.digest()


def _context_files(root: Path, rules: list[tuple[bool, re.Pattern[str]]]) -> Iterator[Path]:
    for directory, dirs, files in os.walk(root):
        here = Path(directory)
        rel_dir = here.relative_to(root).as_posix()
        # .git is never part of an image, and walking it would cost most of a warm run.
        dirs[:] = sorted(d for d in dirs if not (rel_dir == "." and d == ".git"))
        for name in files:
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            if not is_ignored(rel, rules):
                yield here / name
