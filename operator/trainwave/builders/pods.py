"""Worker pods: the user's template, then a short ordered list of mutators.

Pure. Each mutator adds one facet to the draft pod (identity, no unasked-for
API token, the worker container, the torch contract, GPUs). Later capabilities (placement pinning,
RDMA, runtime injection) are new mutators appended to `MUTATORS`, not
branches inside the ones here.
"""

import copy
from typing import Any

from trainwave import contract
from trainwave.builders.gating import set_scheduling_gate
from trainwave.builders.names import (
    master_address,
    service_name,
    worker_hostname,
    worker_pod_name,
)
from trainwave.builders.network import set_network
from trainwave.builders.owners import job_labels, owner_reference
from trainwave.builders.runtime import set_runtime
from trainwave.builders.security import set_service_account_token
from trainwave.builders.sharing import set_shared_gpu
from trainwave.builders.worker import Mutator, Worker
from trainwave.resolving import ResolvedJob

__all__ = ["MUTATORS", "build_worker_pod", "build_worker_pods", "torch_contract"]


def build_worker_pods(
    resolved: ResolvedJob,
    ranks: tuple[int, ...],
    attempt: int,
    runtime_image: str = contract.DEFAULT_RUNTIME_IMAGE,
) -> list[dict[str, Any]]:
    """The pods of `ranks` from the job resolved once by the caller (resolving.py)."""
    return [
        build_worker_pod(
            Worker(
                resolved.job,
                rank,
                attempt,
                runtime_image=runtime_image,
                setup=resolved.setup,
            )
        )
        for rank in ranks
    ]


def build_worker_pod(worker: Worker) -> dict[str, Any]:
    template = worker.job.spec.template
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "labels": dict(template.metadata.labels),
            "annotations": dict(template.metadata.annotations),
        },
        "spec": copy.deepcopy(template.spec),
    }
    for mutate in MUTATORS:
        mutate(pod, worker)
    return pod


def set_identity(pod: dict[str, Any], worker: Worker) -> None:
    meta = worker.job.metadata
    replacements = worker.job.status.replacements
    serial = replacements.serial_of(worker.rank, worker.attempt) if replacements else 0
    pod["metadata"].update(
        name=worker_pod_name(meta.name, worker.rank, worker.attempt, serial),
        namespace=meta.namespace,
        ownerReferences=[owner_reference(meta)],
    )
    labels = pod["metadata"]["labels"]
    labels.update(
        {
            **job_labels(meta),
            contract.LABEL_ROLE: contract.ROLE_WORKER,
            contract.LABEL_RANK: str(worker.rank),
            contract.LABEL_ATTEMPT: str(worker.attempt),
        }
    )
    if serial:
        labels[contract.LABEL_REPLACEMENT] = str(serial)
    else:  # the user's template may not pose as a replacement
        labels.pop(contract.LABEL_REPLACEMENT, None)
    pod["spec"].update(
        hostname=worker_hostname(meta.name, worker.rank),
        subdomain=service_name(meta.name, worker.attempt),
        # Never: a failed worker is a gang event, decided by the failure policy.
        restartPolicy="Never",
    )


def set_placement_notes(pod: dict[str, Any], worker: Worker) -> None:
    """What the placer reads of a running gang from its pods alone (watch cache):
    its priority, whether it may be preempted, when it last was, and how long it may run."""
    spec, status = worker.job.spec, worker.job.status
    notes = pod["metadata"]["annotations"]
    notes[contract.ANNOTATION_PRIORITY] = str(spec.placement.priority)
    notes[contract.ANNOTATION_PREEMPTIBLE] = "true" if spec.placement.preemptible else "false"
    if spec.run_policy.max_run_seconds is not None:
        notes[contract.ANNOTATION_MAX_RUN_SECONDS] = str(spec.run_policy.max_run_seconds)
    else:  # the user's template may not promise a bound the job did not set
        notes.pop(contract.ANNOTATION_MAX_RUN_SECONDS, None)
    if status.last_preemption_time is not None:
        stamp = status.last_preemption_time.isoformat().replace("+00:00", "Z")
        notes[contract.ANNOTATION_PREEMPTED_AT] = stamp


def set_worker_container(pod: dict[str, Any], worker: Worker) -> None:
    spec = worker.job.spec
    containers: list[dict[str, Any]] = pod["spec"].setdefault("containers", [])
    container = next((c for c in containers if c["name"] == contract.WORKER_CONTAINER), None)
    if container is None:
        container = {"name": contract.WORKER_CONTAINER}
        containers.insert(0, container)
    container["image"] = spec.image
    if spec.image_pull_policy:
        container["imagePullPolicy"] = spec.image_pull_policy
    if spec.command:
        container["command"] = list(spec.command)
    if spec.args:
        container["args"] = list(spec.args)
    ports = [p for p in container.get("ports", []) if p.get("name") != contract.MASTER_PORT_NAME]
    ports.append({"name": contract.MASTER_PORT_NAME, "containerPort": spec.master_port})
    container["ports"] = ports
    resources = container.setdefault("resources", {})
    for kind in ("requests", "limits"):
        wanted = getattr(spec.resources, kind)
        if wanted:
            resources.setdefault(kind, {}).update(wanted)


def set_torch_env(pod: dict[str, Any], worker: Worker) -> None:
    container = _worker_container(pod)
    torch_env = torch_contract(worker)
    user_env = [e.model_dump() for e in worker.job.spec.env]
    kept = [
        e for e in container.get("env", []) if e.get("name") not in {u["name"] for u in user_env}
    ]
    # The contract goes first so user values can refer to it, e.g. "$(RANK)":
    # Kubernetes expands only variables defined earlier in the list.
    contract_env = [{"name": k, "value": v} for k, v in torch_env.items()]
    container["env"] = [*contract_env, *kept, *user_env]


def set_gpus(pod: dict[str, Any], worker: Worker) -> None:
    gpus = worker.job.spec.gpus_per_worker
    if gpus == 0:
        return
    # Extended resources are requested through limits; the scheduler and the
    # kubelet account for them per node.
    resources = _worker_container(pod).setdefault("resources", {})
    resources.setdefault("limits", {})[contract.GPU_RESOURCE] = gpus
    # A request the user wrote must equal the limit, or the API server refuses the pod;
    # resolving.template_overrides tells them theirs was replaced.
    if contract.GPU_RESOURCE in resources.get("requests", {}):
        resources["requests"][contract.GPU_RESOURCE] = gpus


def torch_contract(worker: Worker) -> dict[str, str]:
    """torch.distributed's env:// variables and torchrun's PET_* defaults.

    RANK is the global rank of the pod's first process; with processesPerWorker
    > 1, torchrun reads PET_* and sets each process's own RANK and LOCAL_RANK.
    """
    spec = worker.job.spec
    meta = worker.job.metadata
    per_worker = spec.processes_per_worker
    master = master_address(meta.name, worker.attempt)
    port = str(spec.master_port)
    return {
        contract.ENV_MASTER_ADDR: master,
        contract.ENV_MASTER_PORT: port,
        contract.ENV_WORLD_SIZE: str(spec.world_size),
        contract.ENV_RANK: str(worker.rank * per_worker),
        contract.ENV_LOCAL_RANK: "0",
        contract.ENV_LOCAL_WORLD_SIZE: str(per_worker),
        contract.ENV_NODE_RANK: str(worker.rank),
        contract.ENV_PET_NNODES: str(spec.workers),
        contract.ENV_PET_NPROC_PER_NODE: str(per_worker),
        contract.ENV_PET_NODE_RANK: str(worker.rank),
        contract.ENV_PET_MASTER_ADDR: master,
        contract.ENV_PET_MASTER_PORT: port,
        contract.ENV_JOB_NAME: meta.name,
        contract.ENV_JOB_NAMESPACE: meta.namespace,
        contract.ENV_ATTEMPT: str(worker.attempt),
    }


def _worker_container(pod: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in pod["spec"]["containers"] if c["name"] == contract.WORKER_CONTAINER)


MUTATORS: tuple[Mutator, ...] = (
    set_identity,
    set_service_account_token,
    set_placement_notes,
    set_worker_container,
    set_torch_env,
    set_gpus,
    set_network,
    set_runtime,
    set_shared_gpu,
    set_scheduling_gate,
)
