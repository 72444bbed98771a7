"""The two memory tiers: the device the job computes on, and host memory.

On a GPU the device tier is `cuda:N` and the host tier is pinned CPU memory.
Without a GPU the device tier is simulated on the CPU: a tensor "moves to the
device" by being copied into fresh storage from the normal CPU allocator and
"moves to the host" by being copied into a slot of a host arena that lives in
a separately mapped region (not the CPU allocator). The two tiers then never
share storage, each tensor is in exactly one of them, and the CPU allocator's
own statistics (the profiler's memory events) see the device tier alone.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field

import torch

ALIGN = 64


@dataclass(frozen=True)
class DeviceTier:
    device: torch.device
    simulated: bool

    def to_device(self, host: torch.Tensor) -> torch.Tensor:
        if self.simulated:
            return torch.empty_like(host, device=self.device).copy_(host)
        return host.to(self.device, non_blocking=True)


def cuda_available() -> bool:
    return torch.cuda.is_available()


def device_tier(prefer_cuda: bool = True) -> DeviceTier:
    """The GPU when there is one, else the CPU-simulated device tier."""
    if prefer_cuda and cuda_available():
        return DeviceTier(torch.device("cuda", torch.cuda.current_device()), simulated=False)
    return DeviceTier(torch.device("cpu"), simulated=True)


@dataclass
class HostArena:
    """Host slots carved from large chunks allocated once and reused.

    Chunks are memory-mapped files (CPU) or pinned buffers (CUDA), so moving a
    tensor to the host is a copy into a slot, never an allocation. The executor
    keeps two arenas: a static one (parameters, gradients, optimizer state keep
    their slot for the life of the job) and a scratch one for offloaded
    activations, `reset` at every step.
    """

    chunk_bytes: int = 64 << 20
    pinned: bool = False
    # Storage identities of the chunks, shared with the census so host-tier
    # slots are never counted as device memory.
    keys: set[int] = field(default_factory=set)
    chunks: list[torch.UntypedStorage] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)

    def slot(self, like: torch.Tensor) -> torch.Tensor:
        """An uninitialised host tensor shaped and typed like `like`."""
        nbytes = like.numel() * like.element_size()
        chunk, offset = self._reserve(nbytes)
        view = torch.empty(0, dtype=like.dtype)
        view.set_(self.chunks[chunk], offset // like.element_size(), like.shape, contiguous(like))
        return view

    def reset(self) -> None:
        self.offsets = [0] * len(self.chunks)

    @property
    def reserved(self) -> int:
        return sum(chunk.nbytes() for chunk in self.chunks)

    def _reserve(self, nbytes: int) -> tuple[int, int]:
        for index, chunk in enumerate(self.chunks):
            start = -(-self.offsets[index] // ALIGN) * ALIGN
            if start + nbytes <= chunk.nbytes():
                self.offsets[index] = start + nbytes
                return index, start
        chunk = self._allocate(max(self.chunk_bytes, nbytes))
        self.keys.add(int(chunk._cdata))
        self.chunks.append(chunk)
        self.offsets.append(nbytes)
        return len(self.chunks) - 1, 0

    def _allocate(self, nbytes: int) -> torch.UntypedStorage:
        if self.pinned:
            return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True).untyped_storage()
        fd, path = tempfile.mkstemp(prefix="trainwave-host-", dir=shm_dir())
        os.close(fd)
        try:
            storage = torch.UntypedStorage.from_file(path, shared=True, nbytes=nbytes)
            assert isinstance(storage, torch.UntypedStorage)
            return storage
        finally:
            os.unlink(path)  # the mapping keeps the memory; no file is left behind


def contiguous(like: torch.Tensor) -> list[int]:
    """Row-major strides for `like`'s shape."""
    strides, step = [], 1
    for size in reversed(like.shape):
        strides.append(step)
        step *= max(size, 1)
    return strides[::-1]


def shm_dir() -> str | None:
    return "/dev/shm" if os.path.isdir("/dev/shm") else None
