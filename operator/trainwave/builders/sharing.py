"""Shared-GPU workers: GPU memory instead of whole GPUs, pinned and budgeted. Pure.

The worker requests trainwave.io/gpu-memory (MiB), which the node agent
advertises for the GPUs it offers for sharing, so kube-scheduler refuses a
node that would be over-committed. Which GPU the worker uses is chosen at
placement (placement/sharing.py): the placer's release patch writes its UUID
into the pod's trainwave.io/gpu-uuid annotation while the pod is still gated.
Container env cannot change after creation, so the pod is built with env that
the kubelet resolves from that annotation (downward API) when the container
starts, which is after the release: NVIDIA_VISIBLE_DEVICES (the NVIDIA
container runtime mounts that one GPU) and CUDA_VISIBLE_DEVICES (CUDA
enumerates only it), with or without the runtime. Everything here follows
the resolved `SharedSetup`, which status.isolation is written from too.
"""

from typing import Any

from trainwave import contract
from trainwave.api.sharing import SharedSetup
from trainwave.builders.worker import Worker

_FROM_PLACEMENT = {
    "fieldRef": {"fieldPath": f"metadata.annotations['{contract.ANNOTATION_GPU_UUID}']"}
}


def set_shared_gpu(pod: dict[str, Any], worker: Worker) -> None:
    setup = worker.setup
    if setup is None:
        return
    container = next(c for c in pod["spec"]["containers"] if c["name"] == contract.WORKER_CONTAINER)
    limits = container.setdefault("resources", {}).setdefault("limits", {})
    limits[contract.SHARED_GPU_MEMORY_RESOURCE] = setup.memory_mib
    # resolving.check_shared_env refused user values for these names.
    container["env"] = [*container.get("env", []), *shared_env(setup)]
    if setup.arbiter_dir is not None:
        _mount_arbiter(pod, container, setup.arbiter_dir)


def shared_env(setup: SharedSetup) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [
        {"name": contract.ENV_GPU_MEMORY_BUDGET, "value": str(setup.budget_bytes)},
        # First: the socket path below refers to it as $(TRAINWAVE_GPU_UUID).
        {"name": contract.ENV_GPU_UUID, "valueFrom": _FROM_PLACEMENT},
        # No nvidia.com/gpu is requested, so the device plugin mounts nothing; the
        # NVIDIA container runtime reads this variable instead (see the README's
        # "Shared GPUs" for the toolkit settings this route depends on).
        {"name": contract.ENV_NVIDIA_VISIBLE_DEVICES, "valueFrom": _FROM_PLACEMENT},
        # For runtimes that expose every GPU anyway (privileged, or the variable
        # ignored): CUDA then still enumerates only the placed one.
        {"name": contract.ENV_CUDA_VISIBLE_DEVICES, "valueFrom": _FROM_PLACEMENT},
        {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "compute,utility"},
    ]
    if setup.arbiter_dir is not None:
        socket = f"{setup.arbiter_dir}/$({contract.ENV_GPU_UUID}).sock"
        env.append({"name": contract.ENV_ARBITER_SOCKET, "value": socket})
    return env


def _mount_arbiter(pod: dict[str, Any], container: dict[str, Any], directory: str) -> None:
    """The arbiter's host directory at the same path: one socket per shared GPU."""
    volumes = [
        v for v in pod["spec"].get("volumes", []) if v.get("name") != contract.ARBITER_VOLUME
    ]
    # Directory, not DirectoryOrCreate: a node without the arbiter fails the pod's
    # start visibly instead of training against a socket nobody serves.
    volumes.append(
        {"name": contract.ARBITER_VOLUME, "hostPath": {"path": directory, "type": "Directory"}}
    )
    pod["spec"]["volumes"] = volumes
    mounts = [
        m for m in container.get("volumeMounts", []) if m.get("name") != contract.ARBITER_VOLUME
    ]
    mounts.append({"name": contract.ARBITER_VOLUME, "mountPath": directory})
    container["volumeMounts"] = mounts
