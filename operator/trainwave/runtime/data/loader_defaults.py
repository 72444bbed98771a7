"""Data-loader defaults that suit the pod, computed without importing torch.

PyTorch's DataLoader loads in the training process by default (num_workers=0),
so every storage wait stalls the GPU. The launcher computes better defaults
from the pod's CPU quota and whether it has GPUs, and exports them as
TRAINWAVE_LOADER_*; `resolve_loader_defaults` reads them back in the training
process (or computes them when the launcher was not used). Torch-free, so the
launcher starts fast.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from trainwave import contract
from trainwave.runtime.settings import Settings

DEFAULT_PREFETCH_FACTOR = 4
# Items of one batch fetched concurrently inside a worker. Reads that wait on
# storage release the GIL, so a few threads overlap those waits without more
# processes; pure-Python decoding holds the GIL and gains nothing from them.
DEFAULT_FETCH_THREADS = 4
MAX_WORKERS = 16


def cuda_present(root: Path = Path("/")) -> bool:
    """Whether the container was given NVIDIA GPUs (device nodes), without initialising CUDA."""
    return any((root / "dev").glob("nvidia[0-9]*"))


def cpu_quota(root: Path = Path("/")) -> float:
    """CPUs this container may use: the cgroup quota, capped by the CPU affinity mask."""
    affinity = float(len(os.sched_getaffinity(0))) if root == Path("/") else math.inf
    quota = _cgroup_quota(root)
    usable = min(affinity, quota)
    return usable if math.isfinite(usable) else float(os.cpu_count() or 1)


def _cgroup_quota(root: Path) -> float:
    v2 = root / "sys/fs/cgroup/cpu.max"  # "max 100000" or "200000 100000"
    try:
        limit, period = v2.read_text().split()[:2]
        return math.inf if limit == "max" else int(limit) / int(period)
    except (OSError, ValueError):
        pass
    v1 = root / "sys/fs/cgroup/cpu"
    try:
        limit_us = int((v1 / "cpu.cfs_quota_us").read_text())
        period_us = int((v1 / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return math.inf
    return math.inf if limit_us <= 0 else limit_us / period_us


@dataclass(frozen=True)
class LoaderDefaults:
    num_workers: int
    pin_memory: bool
    persistent_workers: bool
    prefetch_factor: int | None
    fetch_threads: int = 1

    def as_env(self) -> dict[str, str]:
        env = {
            contract.ENV_LOADER_NUM_WORKERS: str(self.num_workers),
            contract.ENV_LOADER_PIN_MEMORY: str(self.pin_memory).lower(),
            contract.ENV_LOADER_PERSISTENT_WORKERS: str(self.persistent_workers).lower(),
        }
        if self.prefetch_factor is not None:
            env[contract.ENV_LOADER_PREFETCH_FACTOR] = str(self.prefetch_factor)
        env[contract.ENV_LOADER_FETCH_THREADS] = str(self.fetch_threads)
        return env

    def kwargs(self) -> dict[str, Any]:
        """DataLoader keyword arguments (prefetch/persistence only exist with workers)."""
        values = asdict(self)
        values.pop("fetch_threads")  # applied by wrapping the dataset, not a DataLoader argument
        if self.num_workers == 0:
            values.pop("prefetch_factor")
            values["persistent_workers"] = False
        return values


def compute_loader_defaults(*, cpus: float, processes: int, cuda: bool) -> LoaderDefaults:
    """Workers: this process's share of the CPU quota (at least 1): loading runs in
    parallel with the training step, and storage waits of one worker overlap with
    the others' work. More workers than CPUs helps purely I/O-bound data but hurts
    decoding-bound data, so the default stays at the share."""
    share = cpus / max(1, processes)
    workers = max(1, min(MAX_WORKERS, int(share)))
    return LoaderDefaults(
        num_workers=workers,
        pin_memory=cuda,  # pinning without CUDA only costs memory
        persistent_workers=True,  # no worker start-up cost at every epoch
        prefetch_factor=DEFAULT_PREFETCH_FACTOR,
        fetch_threads=DEFAULT_FETCH_THREADS,
    )


def resolve_loader_defaults(
    settings: Settings, *, cpus: float | None = None, cuda: bool | None = None
) -> LoaderDefaults:
    """The launcher's TRAINWAVE_LOADER_* values, each computed here when absent."""
    computed = compute_loader_defaults(
        cpus=cpu_quota() if cpus is None else cpus,
        processes=settings.identity.nproc_per_node,
        cuda=cuda_present() if cuda is None else cuda,
    )
    given = settings.loader
    return LoaderDefaults(
        num_workers=computed.num_workers if given.num_workers is None else given.num_workers,
        pin_memory=computed.pin_memory if given.pin_memory is None else given.pin_memory,
        persistent_workers=computed.persistent_workers
        if given.persistent_workers is None
        else given.persistent_workers,
        prefetch_factor=computed.prefetch_factor
        if given.prefetch_factor is None
        else given.prefetch_factor,
        fetch_threads=computed.fetch_threads
        if given.fetch_threads is None
        else given.fetch_threads,
    )
