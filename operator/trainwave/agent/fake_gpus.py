"""Fake GPUs from a JSON file (`trainwave agent --fake-gpus FILE`), for tests and simulation.

    {"gpus": [{"uuid": "GPU-0...", "name": "NVIDIA H100 80GB HBM3",
               "memoryMiB": 81559, "pciBusId": "00000000:10:00.0"}, ...],
     "nvlinks": [[0, 1], [2, 3]],        # optional: GPU index pairs joined by NVLink
     "switched": [[0, 1, 2, 3]]}         # optional: groups behind one NVSwitch

Pure apart from reading the one file. Errors name the file, the field, the
value seen and what is accepted.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from trainwave.agent.nvml import FakeGpuBackend, GpuDevice


class FakeGpusError(ValueError):
    """The fake GPU file cannot be read or does not describe GPUs."""


class _FakeGpu(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    uuid: str = Field(min_length=1)
    name: str = Field(min_length=1)
    memory_mib: int = Field(alias="memoryMiB", ge=1)
    pci_bus_id: str = Field(alias="pciBusId", pattern=r"^[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:")


class _FakeGpuFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    gpus: list[_FakeGpu]
    nvlinks: list[tuple[int, int]] = []
    switched: list[list[int]] = []

    @model_validator(mode="after")
    def _indexes_exist(self) -> _FakeGpuFile:
        count = len(self.gpus)
        used = [i for pair in self.nvlinks for i in pair] + [i for g in self.switched for i in g]
        wrong = sorted({index for index in used if not 0 <= index < count})
        if wrong:
            raise ValueError(
                f"nvlinks/switched name GPU index(es) {wrong}; this file has GPUs 0-{count - 1}"
            )
        return self


def load_fake_gpus(path: Path) -> FakeGpuBackend:
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise FakeGpusError(f"--fake-gpus {path}: cannot read JSON: {error}") from error
    try:
        parsed = _FakeGpuFile.model_validate(document)
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(map(str, item['loc'])) or 'document'}: {item['msg']}"
            + ("" if item["type"] == "missing" else f" (got {item['input']!r})")
            for item in error.errors()
        )
        raise FakeGpusError(f"--fake-gpus {path}: {problems}") from error
    devices = [GpuDevice(gpu.uuid, gpu.name, gpu.memory_mib, gpu.pci_bus_id) for gpu in parsed.gpus]
    return FakeGpuBackend(devices, nvlinks=parsed.nvlinks, switched=parsed.switched)


def fake_gpus_document(backend: FakeGpuBackend) -> dict[str, Any]:
    """The file `load_fake_gpus` reads back as `backend`."""
    return {
        "gpus": [
            {
                "uuid": device.uuid,
                "name": device.name,
                "memoryMiB": device.memory_mib,
                "pciBusId": device.pci_bus_id,
            }
            for device in backend.devices
        ],
        "nvlinks": [list(pair) for pair in backend.nvlinks],
        "switched": [list(group) for group in backend.switched],
    }
