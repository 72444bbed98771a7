"""GPUs behind a small interface: NVML on real nodes, a fake in tests.

`pynvml` (the nvidia-ml-py distribution, extra `agent`) is imported only when
an `NvmlBackend` is opened, so this module loads on machines without a driver.
NVML sees GPUs only; NICs come from sysfs (`sysfs.py`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from types import ModuleType, TracebackType
from typing import Any, Protocol


class GpuBackendError(RuntimeError):
    """NVML is missing or failed; the message says which call and why."""


@dataclass(frozen=True)
class GpuDevice:
    uuid: str
    name: str  # as NVML spells it: "NVIDIA H100 80GB HBM3"
    memory_mib: int
    pci_bus_id: str  # any spelling; discovery normalizes it


class GpuBackend(Protocol):
    def count(self) -> int: ...

    def device(self, index: int) -> GpuDevice: ...

    def nvlink_peers(self, index: int) -> frozenset[str]:
        """PCI bus ids at the far end of each active NVLink: GPUs, or NVSwitches."""
        ...


@dataclass
class FakeGpuBackend:
    """GPUs from a list; `nvlinks` joins GPU indices, `switched` groups hang off one NVSwitch."""

    devices: list[GpuDevice]
    nvlinks: Iterable[tuple[int, int]] = ()
    switched: Iterable[Iterable[int]] = ()
    _peers: dict[int, set[str]] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        for a, b in self.nvlinks:
            self._peers.setdefault(a, set()).add(self.devices[b].pci_bus_id)
            self._peers.setdefault(b, set()).add(self.devices[a].pci_bus_id)
        for number, group in enumerate(self.switched):
            for index in group:
                self._peers.setdefault(index, set()).add(f"0000:f{number:x}:00.0")

    def count(self) -> int:
        return len(self.devices)

    def device(self, index: int) -> GpuDevice:
        return self.devices[index]

    def nvlink_peers(self, index: int) -> frozenset[str]:
        return frozenset(self._peers.get(index, ()))


class NvmlBackend:
    """NVML through pynvml; use as a context manager (nvmlInit ... nvmlShutdown).

    Not exercised in CI (no GPU there): the calls are those listed in
    shared/research/runtime-and-rdma.md section 5, checked against nvidia-ml-py 13.615.71.
    """

    def __init__(self) -> None:
        self._nvml: ModuleType | None = None

    def __enter__(self) -> NvmlBackend:
        try:
            import pynvml
        except ImportError as error:
            raise GpuBackendError(
                "pynvml is not installed: install trainwave[agent] (nvidia-ml-py)"
            ) from error
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as error:
            raise GpuBackendError(
                f"nvmlInit failed: {error} (is the NVIDIA driver loaded?)"
            ) from error
        self._nvml = pynvml
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._nvml is not None:
            self._nvml.nvmlShutdown()
            self._nvml = None

    @property
    def nvml(self) -> ModuleType:
        if self._nvml is None:
            raise GpuBackendError("NvmlBackend used outside `with NvmlBackend() as backend:`")
        return self._nvml

    def count(self) -> int:
        return int(self._call("nvmlDeviceGetCount"))

    def device(self, index: int) -> GpuDevice:
        handle = self._call("nvmlDeviceGetHandleByIndex", index)
        memory = self._call("nvmlDeviceGetMemoryInfo", handle)
        pci = self._call("nvmlDeviceGetPciInfo", handle)
        return GpuDevice(
            uuid=_text(self._call("nvmlDeviceGetUUID", handle)),
            name=_text(self._call("nvmlDeviceGetName", handle)),
            memory_mib=int(memory.total) // 2**20,
            pci_bus_id=_text(pci.busId),
        )

    def nvlink_peers(self, index: int) -> frozenset[str]:
        nvml = self.nvml
        handle = self._call("nvmlDeviceGetHandleByIndex", index)
        peers: set[str] = set()
        for link in range(nvml.NVML_NVLINK_MAX_LINKS):
            # Links a GPU does not have answer NotSupported or InvalidArgument.
            try:
                if nvml.nvmlDeviceGetNvLinkState(handle, link) != nvml.NVML_FEATURE_ENABLED:
                    continue
                remote = nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link)
            except nvml.NVMLError:
                continue
            peers.add(_text(remote.busId))
        return frozenset(peers)

    def _call(self, name: str, *args: Any) -> Any:
        nvml = self.nvml
        try:
            return getattr(nvml, name)(*args)
        except nvml.NVMLError as error:
            raise GpuBackendError(f"{name}{args!r} failed: {error}") from error


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


__all__ = ["FakeGpuBackend", "GpuBackend", "GpuBackendError", "GpuDevice", "NvmlBackend"]
