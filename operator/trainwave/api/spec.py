"""TrainingJob spec: what a user asks for.

Pure. Field descriptions start with the JSON name, as Kubernetes API docs do;
they are what `kubectl explain trainingjob.spec` prints. Blocks for later
capabilities (placement, network, gpuSharing, acceleration) slot in beside
`runPolicy` as optional objects, each with its own model.
"""

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, StringConstraints, model_validator

from trainwave import contract
from trainwave.api.base import ApiModel, OpenObject, Quantity, cel, validations
from trainwave.api.network import NetworkSpec
from trainwave.api.runtime import RuntimeSpec
from trainwave.api.scheduling import PlacementSpec
from trainwave.api.sharing import GpuSharingSpec

ENV_NAME_PATTERN = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"
MAX_WORKERS = 10_000
MAX_EXIT_CODES = 255
MAX_REASONS = 32
DEFAULT_MAX_DISRUPTIONS = 20
DEFAULT_MAX_IGNORED = 10
DEFAULT_IGNORE_BACKOFF = 10
MAX_BACKOFF_SECONDS = 300
DEFAULT_NODE_NOT_READY = 60
DEFAULT_STRAGGLER_SLOWDOWN = 1.5
DEFAULT_STRAGGLER_REPORTS = 5
DEFAULT_PREFLIGHT_FRACTION = 0.5
DEFAULT_PREFLIGHT_SIZE_MIB = 64
DEFAULT_PREFLIGHT_TIMEOUT = 120
DEFAULT_PREFLIGHT_MAX_FAILURES = 3
# Condition types and reasons are CamelCase words (a qualified name for types).
CONDITION_WORD_PATTERN = r"^([a-z0-9.-]+/)?[A-Za-z][A-Za-z0-9_.-]*$"
Reason = Annotated[
    str, StringConstraints(min_length=1, max_length=128, pattern=r"^[A-Za-z][A-Za-z0-9_.-]*$")
]
_RESERVED_LIST = ", ".join(f"'{name}'" for name in contract.RESERVED_ENV)

FailureAction = Literal["RestartGang", "FailJob", "Ignore"]
SuccessPolicy = Literal["AllWorkers", "Rank0"]


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


class ExitCodeMatcher(ApiModel):
    model_config = ConfigDict(
        **ApiModel.model_config,
        json_schema_extra=validations(
            cel(
                "self.operator != 'In' || !(0 in self.values)",
                "onExitCodes.values must not contain 0 with operator In: exit code 0 is "
                "success, not a failure",
                ".values",
            ),
            cel(
                "self.values.all(v, self.values.exists_one(w, w == v))",
                "onExitCodes.values must not repeat an exit code",
                ".values",
            ),
        ),
    )

    operator: Literal["In", "NotIn"] = Field(
        description="operator: In matches the listed exit codes, NotIn every other code."
    )
    values: list[int] = Field(
        description="values: exit codes of the worker container, 0-255, without duplicates.",
        min_length=1,
        max_length=MAX_EXIT_CODES,
        json_schema_extra={"items": {"type": "integer", "minimum": 0, "maximum": 255}},
    )


# Mirrors Job podFailurePolicy `onPodConditions` (type and status must be equal),
# plus an optional list of the condition's reasons. (A comment, not a docstring:
# docstrings become the schema's description.)
class PodConditionMatcher(ApiModel):
    type: str = Field(
        description="type of a pod condition, e.g. DisruptionTarget (set by Kubernetes before "
        "it preempts, evicts or deletes a pod for reasons outside the job).",
        min_length=1,
        max_length=316,
        pattern=CONDITION_WORD_PATTERN,
    )
    status: Literal["True", "False", "Unknown"] = Field(
        default="True", description="status the condition must have. Default True."
    )
    reasons: list[Reason] = Field(
        default_factory=list,
        max_length=MAX_REASONS,
        description="reasons: the condition's reason must be one of these; empty matches any. "
        "DisruptionTarget's are PreemptionByScheduler, DeletionByTaintManager, "
        "EvictionByEvictionAPI, DeletionByPodGC and TerminationByKubelet.",
    )


_MATCHERS = "onExitCodes, onPodConditions, onReasons"


class FailureRule(ApiModel):
    model_config = ConfigDict(
        **ApiModel.model_config,
        json_schema_extra=validations(
            cel(
                "[has(self.onExitCodes), has(self.onPodConditions), has(self.onReasons)]"
                ".filter(x, x).size() == 1",
                f"each failurePolicy.rules[] entry needs exactly one of {_MATCHERS}",
            ),
        ),
    )

    action: FailureAction = Field(
        description="action when the first worker in trouble matches: RestartGang restarts "
        "every worker and counts toward maxRestarts; FailJob fails the job at once; Ignore "
        "restarts every worker after a backoff, counted toward maxIgnoredRestarts instead."
    )
    on_exit_codes: ExitCodeMatcher | None = Field(
        default=None,
        description="onExitCodes: which exit codes of the 'worker' container this rule "
        "matches. Exit code 137 is any SIGKILL, OOMKilled included; match onReasons to tell "
        "them apart.",
    )
    on_pod_conditions: list[PodConditionMatcher] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_REASONS,
        description="onPodConditions: the rule matches if the pod has any of these "
        "conditions, e.g. {type: DisruptionTarget} for preemption, eviction, the taint "
        "manager, pod garbage collection or a kubelet shutdown.",
    )
    on_reasons: list[Reason] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_REASONS,
        description="onReasons: the rule matches if any of these is the 'worker' container's "
        "termination reason (OOMKilled, Error, ContainerCannotRun...), the pod's status "
        "reason (Evicted, Terminated, OutOfcpu...), or trainwave's word for its node: "
        "NodeLost (the Node object is gone) or NodeNotReady (NotReady past "
        "nodeNotReadySeconds).",
    )

    @model_validator(mode="after")
    def _one_matcher(self) -> "FailureRule":
        # The CRD's CEL rule says the same; this one speaks to tests and `trainwave plan`.
        given = [
            name
            for name, value in (
                ("onExitCodes", self.on_exit_codes),
                ("onPodConditions", self.on_pod_conditions),
                ("onReasons", self.on_reasons),
            )
            if value is not None
        ]
        if len(given) != 1:
            raise ValueError(
                f"each failurePolicy.rules[] entry needs exactly one of {_MATCHERS}; "
                f"got {', '.join(given) or 'none'}"
            )
        return self


class FailurePolicy(ApiModel):
    max_restarts: int = Field(
        default=3,
        ge=0,
        le=1000,
        description="maxRestarts: how many counted gang restarts (worker failures) are "
        "allowed before the job is Failed. Default 3.",
    )
    max_disruptions: int = Field(
        default=DEFAULT_MAX_DISRUPTIONS,
        ge=0,
        le=1000,
        description="maxDisruptions: how many gang restarts caused by disruptions (node lost "
        "or NotReady, eviction, preemption by the kube-scheduler, kubelet shutdown) are "
        f"allowed before the job is Failed; they do not count toward maxRestarts. Default "
        f"{DEFAULT_MAX_DISRUPTIONS}.",
    )
    max_ignored_restarts: int = Field(
        default=DEFAULT_MAX_IGNORED,
        ge=0,
        le=1000,
        description="maxIgnoredRestarts: how many gang restarts by Ignore rules are allowed "
        f"before the job is Failed. Default {DEFAULT_MAX_IGNORED}.",
    )
    ignore_backoff_seconds: int = Field(
        default=DEFAULT_IGNORE_BACKOFF,
        ge=0,
        le=MAX_BACKOFF_SECONDS,
        description="ignoreBackoffSeconds: the wait before the first Ignore restart; it "
        f"doubles with each one, up to {MAX_BACKOFF_SECONDS} s (the kubelet's crash-loop "
        f"backoff). Default {DEFAULT_IGNORE_BACKOFF}; 0 restarts at once.",
    )
    node_not_ready_seconds: int = Field(
        default=DEFAULT_NODE_NOT_READY,
        ge=0,
        le=3600,
        description="nodeNotReadySeconds: a worker whose node has been NotReady (or Unknown) "
        "this long is a disruption: the gang restarts elsewhere instead of waiting for the "
        f"taint manager's eviction (300 s by default). Default {DEFAULT_NODE_NOT_READY}.",
    )
    rules: list[FailureRule] = Field(
        default_factory=list,
        max_length=20,
        description="rules: evaluated in order on the first worker in trouble; the first "
        "match decides. With no match, a disruption restarts the gang counted toward "
        "maxDisruptions, and any other failure restarts it counted toward maxRestarts "
        "(NCCL ranks cannot survive a lost peer).",
    )


class Stragglers(ApiModel):
    slowdown: float = Field(
        default=DEFAULT_STRAGGLER_SLOWDOWN,
        ge=1.1,
        le=100,
        description="slowdown: a rank whose recent compute time per step is at least this "
        "many times the gang's median is slow. Default "
        f"{DEFAULT_STRAGGLER_SLOWDOWN}.",
    )
    reports: int = Field(
        default=DEFAULT_STRAGGLER_REPORTS,
        ge=1,
        le=1000,
        description="reports: consecutive slow reports (one per telemetry interval) before "
        f"the rank is named in the Straggler condition. Default {DEFAULT_STRAGGLER_REPORTS}.",
    )
    replace: bool = Field(
        default=False,
        description="replace: true marks a named straggler's node (an annotation with an "
        "expiry, never a taint) and replaces that worker. Default false: only reported.",
    )


class Preflight(ApiModel):
    enabled: bool = Field(
        default=False,
        description="enabled: true makes the launchers of every new gang measure the gang's "
        "links (an all-reduce over the job's backend, then a send/receive with the next worker) "
        "before the first step; a worker below the floor is named in the Preflight condition, "
        "its node marked and the gang placed without it. Default false.",
    )
    min_bus_gbps: float | None = Field(
        default=None,
        gt=0,
        le=100_000,
        description="minBusGbps: the absolute floor in Gbit/s for a rank's bus bandwidth "
        "(nccl-tests' busbw). Unset: only the relative floor applies.",
    )
    min_fraction_of_median: float = Field(
        default=DEFAULT_PREFLIGHT_FRACTION,
        gt=0,
        le=1,
        description="minFractionOfMedian: a worker whose bandwidth is below this fraction of "
        f"the median of the other workers' fails. Default {DEFAULT_PREFLIGHT_FRACTION}.",
    )
    size_mib: int = Field(
        default=DEFAULT_PREFLIGHT_SIZE_MIB,
        alias="sizeMiB",  # the unit's own spelling, not the generator's "sizeMib"
        ge=1,
        le=4096,
        description="sizeMiB: the buffer each measured collective moves, in MiB. Default "
        f"{DEFAULT_PREFLIGHT_SIZE_MIB}.",
    )
    timeout_seconds: int = Field(
        default=DEFAULT_PREFLIGHT_TIMEOUT,
        ge=10,
        le=3600,
        description="timeoutSeconds: the launcher gives up on the test after this long and "
        f"starts training, reporting the error. Default {DEFAULT_PREFLIGHT_TIMEOUT}.",
    )
    max_failures: int = Field(
        default=DEFAULT_PREFLIGHT_MAX_FAILURES,
        ge=1,
        le=100,
        description="maxFailures: failed tests in a row after which the gang is no longer "
        "re-placed and trains where it is, the Preflight condition saying so. Default "
        f"{DEFAULT_PREFLIGHT_MAX_FAILURES}.",
    )


class RunPolicy(ApiModel):
    failure_policy: FailurePolicy = Field(
        default_factory=FailurePolicy,
        description="failurePolicy: what a worker failure does to the job.",
        json_schema_extra={"default": {}},
    )
    success_policy: SuccessPolicy = Field(
        default="AllWorkers",
        description="successPolicy: AllWorkers (default) succeeds when every worker exits 0; "
        "Rank0 succeeds when worker 0 exits 0 and stops the rest.",
    )
    active_deadline_seconds: int | None = Field(
        default=None,
        ge=1,
        description="activeDeadlineSeconds: the job fails with reason DeadlineExceeded this "
        "long after it started (the clock restarts on resume).",
    )
    ttl_seconds_after_finished: int | None = Field(
        default=None,
        ge=0,
        description="ttlSecondsAfterFinished: delete the job (and its pods) this long after "
        "it succeeded or failed. Unset keeps it.",
    )
    suspend: bool = Field(
        default=False,
        description="suspend: true deletes the workers and keeps the job; false starts a new "
        "gang. Fields that shape the pods may only change while suspended.",
    )
    hang_timeout_seconds: int | None = Field(
        default=None,
        ge=10,
        le=86_400,
        description="hangTimeoutSeconds: with the runtime, a job whose workers all run but "
        "none completes a training step for this long is hung: the Hung condition names the "
        "stalled ranks and their last steps, and the processes restart in place (cause hang). "
        "Unset (default): no hang detection.",
    )
    stragglers: Stragglers = Field(
        default_factory=Stragglers,
        description="stragglers: with the runtime, how a rank slower than the gang is named "
        "(the Straggler condition) and whether it is replaced.",
        json_schema_extra={"default": {}},
    )
    preflight: Preflight = Field(
        default_factory=Preflight,
        description="preflight: with the runtime, a bandwidth test of the gang's links "
        "before each attempt's first step (off by default).",
        json_schema_extra={"default": {}},
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
