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

from collections.abc import Mapping
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
    resources = container.setdefault("resources", {})
    resources.setdefault("limits", {})[contract.SHARED_GPU_MEMORY_RESOURCE] = setup.memory_mib
    if contract.SHARED_GPU_MEMORY_RESOURCE in resources.get("requests", {}):
        # As set_gpus: a differing request would be refused; the user is told (resolving).
        resources["requests"][contract.SHARED_GPU_MEMORY_RESOURCE] = setup.memory_mib
    # resolving.check_shared_env refused user values for these names.
    container["env"] = [*container.get("env", []), *shared_env(setup)]
    if setup.arbiter_dir is not None:
        _mount_arbiter(pod, container, setup.arbiter_dir)
    if setup.gpu_claim:
        _reference_claim(pod, container)


def claim_name(pod_name: str) -> str:
    """The worker's ResourceClaim: named from the pod, since a pod's claims are fixed at
    creation while the GPU is chosen later; the placer creates it at release."""
    return f"{pod_name}-{contract.DRA_CLAIM_REQUEST}"


def build_gpu_claim(
    pod: Mapping[str, Any], gpu_uuid: str, memory_mib: int
) -> dict[str, Any] | None:
    """The ResourceClaim of a gated shared worker, for the GPU the packer chose; None for a
    pod built without one. kube-scheduler allocates it, so it refuses the GPU when the
    claims already allocated there leave less than `memory_mib` of its memory. The pod
    owns it: the garbage collector deletes it with the pod.

    One request with count 1 and a selector for one device: kube-scheduler v1.34.4 panics
    on count >= 2 against shareable devices (kubernetes/kubernetes#133705)."""
    meta, spec = pod["metadata"], pod["spec"]
    referenced = [
        c["resourceClaimName"]
        for c in spec.get("resourceClaims") or ()
        if c.get("name") == contract.DRA_POD_CLAIM and c.get("resourceClaimName")
    ]
    if not referenced:
        return None
    attribute = f'device.attributes["{contract.DRA_DRIVER}"].{contract.DRA_ATTRIBUTE_UUID}'
    selector = f'{attribute} == "{gpu_uuid}"'
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": referenced[0],
            "namespace": meta["namespace"],
            "labels": {contract.LABEL_ROLE: contract.ROLE_WORKER},
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": meta["name"],
                    "uid": meta["uid"],
                }
            ],
        },
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": contract.DRA_CLAIM_REQUEST,
                        "exactly": {
                            "deviceClassName": contract.DRA_DEVICE_CLASS,
                            "allocationMode": "ExactCount",
                            "count": 1,
                            "selectors": [{"cel": {"expression": selector}}],
                            "capacity": {
                                "requests": {contract.DRA_CAPACITY_MEMORY: f"{memory_mib}Mi"}
                            },
                        },
                    }
                ]
            }
        },
    }


def _reference_claim(pod: dict[str, Any], container: dict[str, Any]) -> None:
    name = claim_name(pod["metadata"]["name"])
    claims = [
        c for c in pod["spec"].get("resourceClaims", []) if c.get("name") != contract.DRA_POD_CLAIM
    ]
    pod["spec"]["resourceClaims"] = [
        *claims,
        {"name": contract.DRA_POD_CLAIM, "resourceClaimName": name},
    ]
    resources = container.setdefault("resources", {})
    used = [c for c in resources.get("claims", []) if c.get("name") != contract.DRA_POD_CLAIM]
    resources["claims"] = [*used, {"name": contract.DRA_POD_CLAIM}]


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
