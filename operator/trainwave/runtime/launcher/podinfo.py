"""The pod's annotations, as the kubelet writes them into a downward API volume.

The file holds one `key="value"` per line with the value quoted the way Go's
strconv.Quote does (backslash escapes, \\xNN, \\uNNNN). The operator puts the
environment that depends on the worker's node (NCCL_IB_HCA, ...) in
contract.ANNOTATION_WORKER_ENV as a JSON object; the launcher exports it.
"""

from __future__ import annotations

import json
from pathlib import Path

from trainwave import contract

ANNOTATIONS_FILE = "annotations"
_SIMPLE = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v"}
_SIMPLE.update({"\\": "\\", '"': '"', "'": "'"})
_HEX_DIGITS = {"x": 2, "u": 4, "U": 8}


class PodInfoError(ValueError):
    """The annotations file or the worker-env annotation cannot be read as documented."""


def unquote_go(quoted: str) -> str:
    """Decode a Go double-quoted string literal."""
    if len(quoted) < 2 or quoted[0] != '"' or quoted[-1] != '"':
        raise PodInfoError(f"{quoted!r}: expected a double-quoted value")
    body, out, i = quoted[1:-1], [], 0
    while i < len(body):
        char = body[i]
        if char != "\\":
            out.append(char)
            i += 1
            continue
        code = body[i + 1 : i + 2]
        if code in _SIMPLE:
            out.append(_SIMPLE[code])
            i += 2
        elif code in _HEX_DIGITS:
            digits = body[i + 2 : i + 2 + _HEX_DIGITS[code]]
            out.append(chr(int(digits, 16)))
            i += 2 + _HEX_DIGITS[code]
        elif code.isdigit():  # \NNN octal
            out.append(chr(int(body[i + 1 : i + 4], 8)))
            i += 4
        else:
            raise PodInfoError(f"{quoted!r}: unknown escape \\{code}")
    text = "".join(out)
    # \xNN escapes are bytes of UTF-8 in Go; re-decode them as such.
    try:
        return text.encode("latin-1").decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        return text


def parse_annotations(text: str) -> dict[str, str]:
    annotations: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise PodInfoError(f'line {number}: {line!r}: expected key="value"')
        try:
            annotations[key.strip()] = unquote_go(value.strip())
        except (PodInfoError, ValueError) as error:
            raise PodInfoError(f"line {number} ({key.strip()}): {error}") from None
    return annotations


def read_annotations(podinfo_dir: Path) -> dict[str, str]:
    """The pod's annotations; empty when the volume or file is absent (not in a pod)."""
    path = podinfo_dir / ANNOTATIONS_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    return parse_annotations(text)


def worker_env(annotations: dict[str, str]) -> dict[str, str]:
    """The operator's per-node environment from contract.ANNOTATION_WORKER_ENV."""
    raw = annotations.get(contract.ANNOTATION_WORKER_ENV)
    if raw is None:
        return {}
    try:
        document = json.loads(raw)
    except ValueError as error:
        raise PodInfoError(
            f"annotation {contract.ANNOTATION_WORKER_ENV}={raw!r}: not JSON ({error})"
        ) from None
    if not isinstance(document, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in document.items()
    ):
        raise PodInfoError(
            f"annotation {contract.ANNOTATION_WORKER_ENV}={raw!r}: expected a JSON object "
            "of string names to string values"
        )
    return document
