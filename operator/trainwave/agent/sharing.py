"""Which GPUs a node offers for sharing, and the node resource that advertises them.

Pure. `--shared-gpus` is `none`, `all` or comma-separated GPU indexes; the
indexes are checked against the GPUs discovery found, so a typo fails loudly
instead of sharing the wrong GPU.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from trainwave.hardware.inventory import GpuInfo

NONE = "none"
ALL = "all"


class SharingError(ValueError):
    """A `--shared-gpus` value that does not name GPUs of this node."""


@dataclass(frozen=True)
class SharedSelection:
    """`all`, or a set of GPU indexes (empty: share nothing)."""

    every_gpu: bool = False
    indexes: frozenset[int] = frozenset()

    def __str__(self) -> str:
        if self.every_gpu:
            return ALL
        return ",".join(map(str, sorted(self.indexes))) or NONE


def parse_selection(text: str) -> SharedSelection:
    """`none` | `all` | `0,2,3` -> a selection; raises SharingError naming the value."""
    value = text.strip().lower()
    if value in ("", NONE):
        return SharedSelection()
    if value == ALL:
        return SharedSelection(every_gpu=True)
    parts = [part.strip() for part in value.split(",")]
    if not all(part.isdigit() for part in parts):
        raise SharingError(
            f"--shared-gpus {text!r}: expected 'none', 'all' or comma-separated GPU indexes "
            "such as '0,1'"
        )
    return SharedSelection(indexes=frozenset(int(part) for part in parts))


def shared_gpus(selection: SharedSelection, gpus: Iterable[GpuInfo]) -> tuple[GpuInfo, ...]:
    """The GPUs the selection names, in index order; every named index must exist."""
    found = {gpu.index: gpu for gpu in gpus}
    if selection.every_gpu:
        return tuple(found[index] for index in sorted(found))
    missing = sorted(selection.indexes - found.keys())
    if missing:
        present = f"0-{max(found)}" if found else "none"
        raise SharingError(
            f"--shared-gpus {selection}: GPU index(es) {','.join(map(str, missing))} not on "
            f"this node; GPUs found: {present}"
        )
    return tuple(found[index] for index in sorted(selection.indexes))


def shared_memory_mib(gpus: Iterable[GpuInfo]) -> int:
    """The value of the node's shared-GPU-memory resource: MiB over every shared GPU."""
    return sum(gpu.memory_mib for gpu in gpus)
