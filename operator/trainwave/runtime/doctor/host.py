"""What the doctor knows about the machine it examines: a root path and an environment.

Every check reads files under `root` (the container's `/`, or a fake tree in
tests) and variables from `environ`, never the process's own globals, so the
same checks run on a worker and on a directory a test wrote.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from trainwave.contract import ENV_NCCL_IB_HCA
from trainwave.hardware.pci import normalize_bus_id


@dataclass(frozen=True)
class Host:
    root: Path = Path("/")
    environ: Mapping[str, str] = field(default_factory=dict)
    # PCI bus ids of this worker's GPUs (sysfs spelling, 0000:18:00.0).
    # None: the GPUs the NVIDIA driver lists in <root>/proc/driver/nvidia/gpus,
    # which the container toolkit narrows to the GPUs given to the container.
    gpus: tuple[str, ...] | None = None
    nccl_logs: tuple[Path, ...] = ()

    def path(self, relative: str) -> Path:
        return self.root / relative.lstrip("/")

    def read(self, relative: str | Path) -> str | None:
        """A file's text, or None when it is missing or unreadable (sysfs can refuse reads)."""
        path = relative if isinstance(relative, Path) else self.path(relative)
        try:
            return path.read_text()
        except (OSError, UnicodeDecodeError):
            return None

    def env(self, name: str) -> str | None:
        value = self.environ.get(name, "").strip()
        return value or None

    def gpu_bus_ids(self) -> tuple[str, ...]:
        if self.gpus is not None:
            return tuple(normalize_bus_id(bus) for bus in self.gpus)
        listing = self.path("proc/driver/nvidia/gpus")
        if not listing.is_dir():
            return ()
        return tuple(sorted(normalize_bus_id(entry.name) for entry in listing.iterdir()))

    def ib_devices(self) -> tuple[str, ...]:
        base = self.path("sys/class/infiniband")
        if not base.is_dir():
            return ()
        return tuple(sorted(entry.name for entry in base.iterdir()))

    def expects_rdma(self) -> bool:
        """Whether this worker should talk RDMA: the operator chose HCAs, or the pod has some."""
        return bool(self.env(ENV_NCCL_IB_HCA)) or bool(self.ib_devices())
