"""Loaders with the runtime's defaults, and a prefetcher that overlaps H2D copies with compute.

`build_loader` and `with_defaults` apply `loader_defaults.LoaderDefaults`
(computed by the launcher from the CPU quota and GPU presence) to loaders
whose settings were left at PyTorch's in-process defaults.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from trainwave.runtime.data.loader_defaults import LoaderDefaults

NO_CUDA = "skipped: no CUDA"


class ConcurrentFetch(Dataset[Any]):
    """A map-style dataset whose batch items are fetched by a small thread pool.

    DataLoader calls `__getitems__(indices)` once per batch when a dataset has
    it; here the items are read concurrently, so per-item storage waits
    overlap inside one worker. The pool is created lazily in the process that
    uses it (never inherited across fork) and is not pickled.
    """

    def __init__(self, dataset: Dataset[Any], threads: int) -> None:
        self.dataset = dataset
        self.threads = threads
        self._pool: ThreadPoolExecutor | None = None
        self._pid = -1

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> Any:
        return self.dataset[index]

    def __getitems__(self, indices: list[int]) -> list[Any]:
        if self._pool is None or self._pid != os.getpid():
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="trainwave-fetch")
            self._pid = os.getpid()
        return list(self._pool.map(self.dataset.__getitem__, indices))

    def __getstate__(self) -> dict[str, Any]:
        return {"dataset": self.dataset, "threads": self.threads, "_pool": None, "_pid": -1}


def concurrent(dataset: Dataset[Any], threads: int) -> Dataset[Any]:
    """Wrap a map-style dataset for concurrent fetching; others are returned as they are."""
    eligible = (
        threads > 1
        and not isinstance(dataset, IterableDataset | ConcurrentFetch)
        and hasattr(dataset, "__len__")
        and getattr(dataset, "__getitems__", None) is None  # it batches its own reads
    )
    return ConcurrentFetch(dataset, threads) if eligible else dataset


def build_loader(dataset: Dataset[Any], defaults: LoaderDefaults, **kwargs: Any) -> DataLoader[Any]:
    """A DataLoader with the runtime's defaults; explicit keyword arguments win."""
    merged = defaults.kwargs()
    merged.update(kwargs)
    if merged.get("num_workers", 0) == 0:
        merged.pop("prefetch_factor", None)
        merged["persistent_workers"] = False
    return DataLoader(concurrent(dataset, defaults.fetch_threads), **merged)


def with_defaults(loader: DataLoader[Any], defaults: LoaderDefaults) -> DataLoader[Any]:
    """Rebuild a loader that kept PyTorch's in-process loading with the runtime's defaults.

    A loader that already has workers is returned unchanged: its owner chose.
    The sampler, batch sampler, collate function and generator are kept.
    """
    if loader.num_workers > 0 or defaults.num_workers == 0:
        return loader
    kwargs: dict[str, Any] = {
        "collate_fn": loader.collate_fn,
        "timeout": loader.timeout,
        "worker_init_fn": loader.worker_init_fn,
        "generator": loader.generator,
        "pin_memory": loader.pin_memory or defaults.pin_memory,
        "num_workers": defaults.num_workers,
        "persistent_workers": defaults.persistent_workers,
        "prefetch_factor": defaults.prefetch_factor,
    }
    if loader.batch_size is None:  # the user passed a batch_sampler, or batch_size=None
        if loader.batch_sampler is not None:
            kwargs["batch_sampler"] = loader.batch_sampler
        else:
            kwargs.update(batch_size=None, sampler=loader.sampler)
    else:
        kwargs.update(
            batch_size=loader.batch_size, sampler=loader.sampler, drop_last=loader.drop_last
        )
    return DataLoader(concurrent(loader.dataset, defaults.fetch_threads), **kwargs)


class DevicePrefetcher:
    """Iterate a loader with the next batch's host-to-device copy already in flight.

    On CUDA, batch i+1 is copied on a side stream (from pinned memory, so the
    copy is asynchronous) while the model computes on batch i; the compute
    stream waits for the copy only when it takes the batch, and each tensor is
    recorded on the compute stream so its memory is not reused too early (the
    pattern of NVIDIA Apex's imagenet data_prefetcher). Without CUDA it moves
    batches to `device` as they come and `status` says "skipped: no CUDA".
    """

    def __init__(self, loader: Iterable[Any], device: torch.device | str | None = None) -> None:
        self.loader = loader
        self.device = torch.device(device) if device is not None else _default_device()
        self.enabled = self.device.type == "cuda" and torch.cuda.is_available()
        self.status = "on" if self.enabled else NO_CUDA
        self._stream = torch.cuda.Stream(self.device) if self.enabled else None  # type: ignore[no-untyped-call]

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Any]:
        if self._stream is None:
            for batch in self.loader:
                yield move(batch, self.device, non_blocking=False)
            return
        stream = self._stream
        batches = iter(self.loader)
        upcoming = self._start_copy(batches, stream)
        while upcoming is not _END:
            current_stream = torch.cuda.current_stream(self.device)
            current_stream.wait_stream(stream)
            _record(upcoming, current_stream)
            batch = upcoming
            upcoming = self._start_copy(batches, stream)
            yield batch

    def _start_copy(self, batches: Iterator[Any], stream: torch.cuda.Stream) -> Any:
        try:
            batch = next(batches)
        except StopIteration:
            return _END
        with torch.cuda.stream(stream):
            return move(_pinned(batch), self.device, non_blocking=True)


_END = object()


def _default_device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def move(batch: Any, device: torch.device, *, non_blocking: bool) -> Any:
    """Move every tensor inside lists, tuples, dicts (and namedtuples) to `device`."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, Mapping):
        return type(batch)(
            {k: move(v, device, non_blocking=non_blocking) for k, v in batch.items()}
        )  # type: ignore[call-arg]
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(move(v, device, non_blocking=non_blocking) for v in batch))
    if isinstance(batch, list | tuple):
        return type(batch)(move(v, device, non_blocking=non_blocking) for v in batch)
    return batch


def _pinned(batch: Any) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch if batch.is_pinned() or batch.is_cuda else batch.pin_memory()
    if isinstance(batch, Mapping):
        return type(batch)({k: _pinned(v) for k, v in batch.items()})  # type: ignore[call-arg]
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(_pinned(v) for v in batch))
    if isinstance(batch, list | tuple):
        return type(batch)(_pinned(v) for v in batch)
    return batch


def _record(batch: Any, stream: torch.cuda.Stream) -> None:
    if isinstance(batch, torch.Tensor):
        batch.record_stream(stream)
    elif isinstance(batch, Mapping):
        for value in batch.values():
            _record(value, stream)
    elif isinstance(batch, list | tuple):
        for value in batch:
            _record(value, stream)
