"""TrainingJob spec: what a user asks for.

Pure. Field descriptions start with the JSON name, as Kubernetes API docs do;
they are what `kubectl explain trainingjob.spec` prints. Blocks for later
capabilities (placement, network, gpuSharing, acceleration) slot in beside
`runPolicy` (run_policy.py) as optional objects, each with its own model.
"""

from typing import Any, Literal

from pydantic import ConfigDict, Field

from trainwave import contract
from trainwave.api.base import ApiModel, OpenObject, Quantity, cel, validations
from trainwave.api.network import NetworkSpec
from trainwave.api.run_policy import RunPolicy
from trainwave.api.runtime import RuntimeSpec
from trainwave.api.scheduling import PlacementSpec
from trainwave.api.sharing import GpuSharingSpec

ENV_NAME_PATTERN = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"
MAX_WORKERS = 10_000

_RESERVED_LIST = ", ".join(f"'{name}'" for name in contract.RESERVED_ENV)


class EnvVar(ApiModel):
    name: str = Field(
        description="name of the environment variable. Names trainwave sets for the torch "
        "rendezvous (MASTER_ADDR, RANK, WORLD_SIZE, PET_*, TRAINWAVE_*) are refused.",
        min_length=1,
        max_length=256,
        pattern=ENV_NAME_PATTERN,
    )
    value: str = Field(default="", description="value of the variable.", max_length=32_768)


class ResourceRequirements(ApiModel):
    requests: dict[str, Quantity] = Field(
        default_factory=dict,
        description="requests: resources each worker container asks for, e.g. cpu: 8, "
        "memory: 64Gi. GPUs come from gpusPerWorker.",
        max_length=32,
    )
    limits: dict[str, Quantity] = Field(
        default_factory=dict,
        description="limits: resource limits of each worker container.",
        max_length=32,
    )


class TemplateMetadata(ApiModel):
    labels: dict[str, str] = Field(
        default_factory=dict, description="labels added to every worker pod.", max_length=64
    )
    annotations: dict[str, str] = Field(
        default_factory=dict, description="annotations added to every worker pod.", max_length=64
    )


class PodTemplate(ApiModel):
    metadata: TemplateMetadata = Field(
        default_factory=TemplateMetadata,
        description="metadata: labels and annotations for the worker pods.",
    )
    spec: OpenObject = Field(
        default_factory=dict,
        description="spec: a PodSpec fragment for everything trainwave does not set itself "
        "(tolerations, volumes, nodeSelector, affinity, extra containers, a pre-declared "
        "'worker' container with volumeMounts...). trainwave fills in the 'worker' "
        "container's image, command, args, env and resources, restartPolicy, hostname and "
        "subdomain.",
    )


# Fields that shape the pods; changing them under running workers would leave
# a gang whose members disagree, so they change only while suspended.
IMMUTABLE_WHILE_RUNNING = (
    "workers",
    "processesPerWorker",
    "gpusPerWorker",
    "image",
    "command",
    "args",
    "env",
    "resources",
    "masterPort",
    "template",
    "network",
    "runtime",
    "gpuSharing",
)


def _immutable_rules() -> dict[str, Any]:
    launcher = cel(
        "!has(self.runtime) || !self.runtime.enabled || "
        "(has(self.command) && size(self.command) > 0)",
        "spec.command must be set when spec.runtime is enabled: the launcher wraps the "
        "command, and the image's own entrypoint cannot be seen from the cluster",
    )
    shared_gpus = cel(
        "!has(self.gpuSharing) || !has(self.gpusPerWorker) || self.gpusPerWorker == 0",
        "spec.gpuSharing asks for part of one GPU per worker; set spec.gpusPerWorker to 0 "
        "(or leave it out) with it",
    )
    shared_gang = cel(
        "!has(self.gpuSharing) || self.workers == 1 || self.gpuSharing.allowMultipleWorkers",
        "spec.gpuSharing with more than one worker needs spec.gpuSharing.allowMultipleWorkers: "
        "true (a gang on shared GPUs runs at the pace of its slowest sharer)",
    )
    rules = [launcher, shared_gpus, shared_gang] + [
        cel(
            # Optional fields may be absent on either side: absent == absent.
            f"oldSelf.runPolicy.suspend || (has(self.{field}) ? has(oldSelf.{field}) && "
            f"self.{field} == oldSelf.{field} : !has(oldSelf.{field}))",
            f"spec.{field} is immutable while the job is not suspended; "
            "set spec.runPolicy.suspend: true first, or create a new job",
            f".{field}",
        )
        for field in IMMUTABLE_WHILE_RUNNING
    ]
    return validations(*rules)


class TrainingJobSpec(ApiModel):
    model_config = ConfigDict(
        **ApiModel.model_config,
        json_schema_extra=_immutable_rules(),
    )

    workers: int = Field(
        ge=1,
        le=MAX_WORKERS,
        description=f"workers: number of worker pods in the gang, 1-{MAX_WORKERS}. All start "
        "together or none does.",
    )
    processes_per_worker: int = Field(
        default=1,
        ge=1,
        le=64,
        description="processesPerWorker: training processes in each worker pod (torchrun "
        "--nproc-per-node). Default 1.",
    )
    gpus_per_worker: int = Field(
        default=0,
        ge=0,
        le=64,
        description="gpusPerWorker: whole GPUs (nvidia.com/gpu) each worker requests, 0-64.",
    )
    image: str = Field(
        min_length=1, max_length=1024, description="image: container image of the workers."
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = Field(
        default=None, description="imagePullPolicy of the worker container."
    )
    command: list[str] = Field(
        default_factory=list,
        max_length=64,
        description="command: entrypoint of the worker container; the image's when empty.",
    )
    args: list[str] = Field(
        default_factory=list,
        max_length=256,
        description="args: arguments to the command.",
    )
    env: list[EnvVar] = Field(
        default_factory=list,
        max_length=256,
        description="env: environment of the worker container, added to what trainwave sets.",
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["name"],
            **validations(
                cel(
                    f"self.all(e, !(e.name in [{_RESERVED_LIST}]))",
                    "spec.env must not set a name trainwave reserves for the torch rendezvous: "
                    + ", ".join(contract.RESERVED_ENV),
                )
            ),
        },
    )
    resources: ResourceRequirements = Field(
        default_factory=ResourceRequirements,
        description="resources: cpu, memory and other resources of each worker container.",
    )
    master_port: int = Field(
        default=contract.DEFAULT_MASTER_PORT,
        ge=1,
        le=65535,
        description="masterPort: TCP port of the rendezvous on worker 0. Default 29500.",
    )
    template: PodTemplate = Field(
        default_factory=PodTemplate,
        description="template: the rest of the worker pod (tolerations, volumes, ...).",
    )
    run_policy: RunPolicy = Field(
        default_factory=RunPolicy,
        description="runPolicy: restarts, success, deadlines, cleanup and suspension.",
        json_schema_extra={"default": {}},
    )
    placement: PlacementSpec = Field(
        default_factory=PlacementSpec,
        description="placement: topology constraints, priority and parallelism of the gang.",
        json_schema_extra={"default": {}},
    )
    network: NetworkSpec | None = Field(
        default=None,
        description="network: RDMA / GPUDirect, Multus networks, host network, /dev/shm.",
    )
    runtime: RuntimeSpec | None = Field(
        default=None,
        description="runtime: inject trainwave's acceleration runtime into the workers.",
    )
    gpu_sharing: GpuSharingSpec | None = Field(
        default=None,
        description="gpuSharing: GPU memory on one shared GPU per worker instead of whole GPUs.",
    )

    @property
    def total_gpus(self) -> int:
        return self.workers * self.gpus_per_worker

    @property
    def world_size(self) -> int:
        return self.workers * self.processes_per_worker
