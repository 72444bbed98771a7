"""TrainingJob spec.runPolicy: how a gang's failures, disruptions, stragglers and
preflight checks are judged, and when the job counts as succeeded.

Pure. Field descriptions start with the JSON name, as in spec.py; the CRD, the chart's
CRD and values schema and docs/reference are generated from these models.
"""

from typing import Annotated, Literal

from pydantic import ConfigDict, Field, StringConstraints, model_validator

from trainwave.api.base import ApiModel, cel, validations

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
DEFAULT_REPLACEMENT_TIMEOUT = 300
# Condition types and reasons are CamelCase words (a qualified name for types).
CONDITION_WORD_PATTERN = r"^([a-z0-9.-]+/)?[A-Za-z][A-Za-z0-9_.-]*$"
Reason = Annotated[
    str, StringConstraints(min_length=1, max_length=128, pattern=r"^[A-Za-z][A-Za-z0-9_.-]*$")
]

FailureAction = Literal["RestartGang", "FailJob", "Ignore"]
SuccessPolicy = Literal["AllWorkers", "Rank0"]


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


class WorkerReplacement(ApiModel):
    enabled: bool = Field(
        default=True,
        description="enabled: with the runtime and spec.runtime.inPlaceRestarts above 0, a "
        "worker whose pod is lost to a disruption (node lost or NotReady, drain or eviction, "
        "pod deleted) or replaced as a straggler is recreated alone, on a node of the gang's "
        "topology domain where one has room; the other workers keep their pods and re-enter "
        "torch's rendezvous (for worker 0, which hosts the rendezvous store, their agents "
        "start again and meet the new worker 0's store). Default true; false always "
        "recreates the gang.",
    )
    timeout_seconds: int = Field(
        default=DEFAULT_REPLACEMENT_TIMEOUT,
        ge=10,
        le=3600,
        description="timeoutSeconds: a replacement worker not running this long after it was "
        "decided (no room, not bound, not started) gives up: the gang is recreated instead. "
        f"Default {DEFAULT_REPLACEMENT_TIMEOUT}, half of torch's rendezvous join timeout "
        "(600 s), which the waiting workers would otherwise reach.",
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
    max_run_seconds: int | None = Field(
        default=None,
        ge=1,
        le=31_536_000,
        description="maxRunSeconds: each attempt's gang runs at most this long after it is "
        "placed, then the job fails with reason DeadlineExceeded. Time waiting in the queue "
        "does not count (unlike activeDeadlineSeconds). "
        "The queue may start such a gang on room held for a larger one when it ends "
        "before that one could start (backfill). Read when the pods are created.",
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
        "stalled ranks and their last steps, and the processes restart in place (cause hang); "
        "with spec.runtime.inPlaceRestarts 0, or still hung a timeout later, the gang is "
        "recreated. Unset (default): no hang detection.",
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
    worker_replacement: WorkerReplacement = Field(
        default_factory=WorkerReplacement,
        description="workerReplacement: with the runtime's in-place restarts, replace one lost "
        "worker instead of recreating the gang (on by default).",
        json_schema_extra={"default": {}},
    )
