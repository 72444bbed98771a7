"""Shared-GPU workers: GPU memory instead of whole GPUs, and what isolation that gives. Pure.

The worker requests trainwave.io/gpu-memory (MiB), which the node agent
advertises for the GPUs it offers for sharing, so kube-scheduler refuses a
node that would be over-committed. Which GPU the worker uses is chosen at
placement (placement/sharing.py) and handed over as CUDA_VISIBLE_DEVICES in
the worker-env annotation; its memory budget is in the pod's env from the start.
"""

from typing import Any

from trainwave import contract
from trainwave.builders.worker import Worker


def set_shared_gpu(pod: dict[str, Any], worker: Worker) -> None:
    memory = worker.shared
    if memory is None:
        return
    container = next(c for c in pod["spec"]["containers"] if c["name"] == contract.WORKER_CONTAINER)
    limits = container.setdefault("resources", {}).setdefault("limits", {})
    limits[contract.SHARED_GPU_MEMORY_RESOURCE] = memory.mib
    present = {e.get("name") for e in container.get("env", [])}
    env = {
        contract.ENV_GPU_MEMORY_BUDGET: str(memory.bytes),
        # No nvidia.com/gpu is requested, so the device plugin mounts nothing:
        # the NVIDIA container runtime exposes the node's GPUs and the launcher
        # narrows CUDA to the pinned one (CUDA_VISIBLE_DEVICES, by UUID).
        "NVIDIA_VISIBLE_DEVICES": "all",
        "NVIDIA_DRIVER_CAPABILITIES": "compute,utility",
    }
    container["env"] = [
        *container.get("env", []),
        *({"name": k, "value": v} for k, v in env.items() if k not in present),
    ]
