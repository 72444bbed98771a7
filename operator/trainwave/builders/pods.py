"""Worker pods: the user's template, then a short ordered list of mutators.

Pure. Each mutator adds one facet to the draft pod (identity, the worker
container, the torch contract, GPUs). Later capabilities (placement pinning,
RDMA, runtime injection) are new mutators appended to `MUTATORS`, not
branches inside the ones here.
"""

import copy
from typing import Any

from trainwave import contract
from trainwave.api.trainingjob import InvalidSpec, TrainingJob
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
from trainwave.builders.sharing import set_shared_gpu
from trainwave.builders.worker import Mutator, Worker
from trainwave.sizing.requests import shared_memory

# Pod fields trainwave owns; a template that sets them is refused rather than
# silently overridden, so the user learns why their value had no effect.
_OWNED_POD_FIELDS = {
    "hostname": "trainwave sets it to '<job>-worker-<rank>' for the rendezvous",
    "subdomain": "trainwave sets it to the job's headless Service",
}


def check_template(job: TrainingJob) -> None:
    """Raise InvalidSpec for what the schema cannot see inside spec.template.spec."""
    spec = job.spec.template.spec
    for key, why in _OWNED_POD_FIELDS.items():
        if key in spec:
            raise InvalidSpec(f"spec.template.spec.{key} must not be set: {why}")
    policy = spec.get("restartPolicy", "Never")
    if policy != "Never":
        raise InvalidSpec(
            f"spec.template.spec.restartPolicy is {policy!r}; accepted: 'Never' or unset "
            "(trainwave restarts the whole gang itself, see runPolicy.failurePolicy)"
        )
    if job.spec.gpu_sharing is not None:
        try:
            shared_memory(job.spec.gpu_sharing)
        except ValueError as error:
            raise InvalidSpec(str(error)) from None
    runtime = job.spec.runtime
    if runtime is not None and runtime.enabled and not job.spec.command:
        raise InvalidSpec(
            "spec.command must be set when spec.runtime is enabled: the launcher wraps it"
        )
    containers = spec.get("containers", [])
    if not isinstance(containers, list) or not all(
        isinstance(c, dict) and isinstance(c.get("name"), str) for c in containers
    ):
        raise InvalidSpec("spec.template.spec.containers must be a list of containers with names")
    for container in containers:
        _check_merged_fields(container)
        where = f"spec.template.spec.containers[{container['name']}].env"
        env = container.get("env", [])
        if not isinstance(env, list) or not all(isinstance(e, dict) for e in env):
            raise InvalidSpec(f"{where} must be a list of name/value pairs (got {env!r})")
        reserved = sorted({str(e.get("name")) for e in env} & set(contract.RESERVED_ENV))
        if reserved:
            raise InvalidSpec(
                f"{where} sets {', '.join(reserved)}: trainwave reserves these names for the "
                "torch rendezvous"
            )


def _check_merged_fields(container: dict[str, Any]) -> None:
    """The worker container's fields trainwave merges into must have the right shape."""
    if container["name"] != contract.WORKER_CONTAINER:
        return
    where = f"spec.template.spec.containers[{container['name']}]"
    ports = container.get("ports", [])
    if not isinstance(ports, list) or not all(isinstance(p, dict) for p in ports):
        raise InvalidSpec(f"{where}.ports must be a list of ports (got {ports!r})")
    resources = container.get("resources", {})
    if not isinstance(resources, dict) or not all(
        isinstance(resources.get(kind, {}), dict) for kind in ("requests", "limits")
    ):
        raise InvalidSpec(
            f"{where}.resources must be an object with requests and limits maps (got {resources!r})"
        )


def build_worker_pods(
    job: TrainingJob,
    ranks: tuple[int, ...],
    attempt: int,
    runtime_image: str = contract.DEFAULT_RUNTIME_IMAGE,
) -> list[dict[str, Any]]:
    """The pods of `ranks`; the caller has passed the job through `check_template` once."""
    return [
        build_worker_pod(Worker(job, rank, attempt, runtime_image=runtime_image)) for rank in ranks
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
    pod["metadata"].update(
        name=worker_pod_name(meta.name, worker.rank, worker.attempt),
        namespace=meta.namespace,
        ownerReferences=[owner_reference(meta)],
    )
    pod["metadata"]["labels"].update(
        {
            **job_labels(meta),
            contract.LABEL_ROLE: contract.ROLE_WORKER,
            contract.LABEL_RANK: str(worker.rank),
            contract.LABEL_ATTEMPT: str(worker.attempt),
        }
    )
    pod["spec"].update(
        hostname=worker_hostname(meta.name, worker.rank),
        subdomain=service_name(meta.name),
        # Never: a failed worker is a gang event, decided by the failure policy.
        restartPolicy="Never",
    )


def set_placement_notes(pod: dict[str, Any], worker: Worker) -> None:
    """What the placer reads of a running gang from its pods alone (watch cache):
    its priority, whether it may be preempted, and when it last was."""
    spec, status = worker.job.spec, worker.job.status
    notes = pod["metadata"]["annotations"]
    notes[contract.ANNOTATION_PRIORITY] = str(spec.placement.priority)
    notes[contract.ANNOTATION_PREEMPTIBLE] = "true" if spec.placement.preemptible else "false"
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


def torch_contract(worker: Worker) -> dict[str, str]:
    """torch.distributed's env:// variables and torchrun's PET_* defaults.

    RANK is the global rank of the pod's first process; with processesPerWorker
    > 1, torchrun reads PET_* and sets each process's own RANK and LOCAL_RANK.
    """
    spec = worker.job.spec
    meta = worker.job.metadata
    per_worker = spec.processes_per_worker
    master = master_address(meta.name)
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
    set_placement_notes,
    set_worker_container,
    set_torch_env,
    set_gpus,
    set_network,
    set_runtime,
    set_shared_gpu,
    set_scheduling_gate,
)
