"""The CDI spec of the shared GPUs: what a container gets for `trainwave.io/gpu=gpu-<i>`.

The container runtime (containerd or CRI-O with CDI on) applies a device's
edits when the kubelet passes its CDI id from NodePrepareResources. The edit
is NVIDIA_VISIBLE_DEVICES = the GPU's UUID, so the NVIDIA container runtime
mounts that GPU and no other: the same toolkit route as env pinning (README,
Shared GPUs), now handed out by the device allocation instead of the pod spec.
Device nodes are not listed: their minor numbers are not the NVML indexes the
agent knows, and the NVIDIA runtime resolves them from the UUID.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trainwave import contract
from trainwave.agent.files import replace_if_changed
from trainwave.agent.slices import device_name
from trainwave.hardware.inventory import GpuInfo

CDI_VERSION = "0.6.0"
SPEC_FILE = "trainwave.io-gpu.json"


def cdi_spec(shared: Sequence[GpuInfo]) -> dict[str, Any]:
    return {
        "cdiVersion": CDI_VERSION,
        "kind": contract.CDI_KIND,
        "devices": [
            {
                "name": device_name(gpu),
                "containerEdits": {
                    "env": [f"{contract.ENV_NVIDIA_VISIBLE_DEVICES}={gpu.uuid}"],
                },
            }
            for gpu in shared
        ],
    }


def write_cdi_spec(directory: Path, shared: Sequence[GpuInfo]) -> bool:
    """Write the spec if it changed, atomically (runtimes watch the directory); True if written."""
    text = json.dumps(cdi_spec(shared), indent=2, sort_keys=True) + "\n"
    return replace_if_changed(directory / SPEC_FILE, text)
