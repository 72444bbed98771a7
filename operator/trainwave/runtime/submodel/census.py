"""Measures of device-tier memory that do not trust the executor's bookkeeping.

`StorageCensus` watches every tensor an operator produces (a TorchDispatchMode,
below autograd, so backward's tensors and temporaries are seen too) and keeps a
weakref finalizer on each distinct storage: live bytes rise when a storage is
made and fall when the last tensor using it is freed, whatever code held it.

`allocator_peak` reads the CPU allocator's own allocation events through the
profiler: on the CPU-simulated device tier every allocation is a device-tier
allocation (the host tier lives in mapped chunks, not in that allocator), so
the running sum of those events is a third, independent peak. On CUDA the
equivalent is `torch.cuda.max_memory_allocated`.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


def storage_key(tensor: torch.Tensor) -> int:
    """Identity of the storage behind a tensor (views share it)."""
    return int(tensor.untyped_storage()._cdata)


class StorageCensus(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Live bytes of storages created while active, and their peak."""

    def __init__(self, ignore: Iterable[torch.UntypedStorage] = ()) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.ignored = {int(s._cdata) for s in ignore}
        self.live: dict[int, int] = {}
        self.current = 0
        self.peak = 0

    def ignore(self, storages: Iterable[torch.UntypedStorage]) -> None:
        self.ignored.update(int(s._cdata) for s in storages)

    def reset_peak(self) -> None:
        self.peak = self.current

    def track(self, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        key = int(storage._cdata)
        nbytes = storage.nbytes()
        if key in self.live or key in self.ignored or nbytes == 0:
            return
        self.live[key] = nbytes
        self.current += nbytes
        self.peak = max(self.peak, self.current)
        weakref.finalize(storage, self._freed, key)

    def _freed(self, key: int) -> None:
        self.current -= self.live.pop(key, 0)

    def __torch_dispatch__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        # An output sharing an input's storage (in-place ops, views) is not a
        # new allocation; tracking it would count memory made before the census.
        inputs = {
            storage_key(t) for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)
        }
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor) and storage_key(leaf) not in inputs:
                self.track(leaf)
        return out


@contextmanager
def allocator_events() -> Iterator[list[int]]:
    """Collect the CPU allocator's allocation (+) and free (-) sizes, in order."""
    sizes: list[int] = []
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        yield sizes
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    events.sort(key=lambda e: e.start_ns())
    sizes.extend(int(e.nbytes()) for e in events)


def running_peak(sizes: Iterable[int]) -> int:
    """Highest running sum of allocation events, from zero at the start."""
    total = peak = 0
    for size in sizes:
        total += size
        peak = max(peak, total)
    return peak
