"""TrainingJob status: what the operator observed and decided.

Pure. Conditions are keyed by type (a list-map on the server), never read as
"the last one". `attempt` names the gang incarnation the current pods belong
to; it is part of every pod's name, so a restarted gang never collides with
the pods of the one before it.
"""

from datetime import datetime
from enum import StrEnum

from pydantic import ConfigDict, Field

from trainwave.api.base import ApiModel

# Status is the operator's own writing, read back on every reconcile: a field
# this version does not know (written by a newer one, or by hand) is ignored
# rather than making the whole status unreadable and the job look new.
_LENIENT = ConfigDict(**{**ApiModel.model_config, "extra": "ignore"})


class Phase(StrEnum):
    PENDING = "Pending"
    SCHEDULING = "Scheduling"
    STARTING = "Starting"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"

    @property
    def terminal(self) -> bool:
        return self in (Phase.SUCCEEDED, Phase.FAILED)


class ConditionType(StrEnum):
    CREATED = "Created"
    ADMITTED = "Admitted"  # by Kueue, for jobs with a queue-name label
    SCHEDULED = "Scheduled"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    RDMA_VERIFIED = "RDMAVerified"
    PREEMPTED = "Preempted"
    REPLICA_FAILURE = "ReplicaFailure"  # the API server refused a worker pod or the Service
    # The worker container asks for a resource trainwave sets itself (GPUs, GPU memory,
    # RDMA devices), with another value: theirs is replaced, the message says by what.
    RESOURCES_OVERRIDDEN = "ResourcesOverridden"
    RECONCILE_ERROR = "ReconcileError"  # an unexpected error in the operator; retried with backoff
    # From the runtime's reports (lifecycle/goodput.py): no rank completed a step for
    # runPolicy.hangTimeoutSeconds; a rank slower than the gang's median.
    HUNG = "Hung"
    STRAGGLER = "Straggler"
    # runPolicy.preflight: the gang's links measured before the first step (lifecycle/preflight.py).
    PREFLIGHT = "Preflight"
    # runPolicy.workerReplacement: a lost worker being recreated alone (lifecycle/replacing.py).
    WORKER_REPLACEMENT = "WorkerReplacement"


class Condition(ApiModel):
    model_config = _LENIENT

    type: ConditionType = Field(description="type of the condition.")
    status: str = Field(
        description="status: True, False or Unknown.",
        json_schema_extra={"enum": ["True", "False", "Unknown"]},
    )
    reason: str = Field(default="", description="reason: a CamelCase word for machines.")
    message: str = Field(default="", description="message: what happened, for people.")
    last_transition_time: datetime | None = Field(
        default=None, description="lastTransitionTime: when status last changed."
    )
    observed_generation: int | None = Field(
        default=None, description="observedGeneration: the spec generation this was set for."
    )


class PreemptionNote(ApiModel):
    """Written by the placer before it deletes a preempted gang's pods, so the job's
    reconcile restarts it uncounted even if the pods are gone before it looks."""

    model_config = _LENIENT

    preemptor: str = Field(description="preemptor: the gang that needed the room (namespace/name).")
    attempt: int = Field(description="attempt: the attempt that was preempted.")


class PlacementStatus(ApiModel):
    model_config = _LENIENT

    nodes: list[str] = Field(
        default_factory=list,
        description="nodes: the node of each rank, in rank order.",
        json_schema_extra={"items": {"type": "string", "maxLength": 253}},
    )
    summary: str = Field(
        default="", description="summary: how tightly the gang sits, per topology level."
    )


class ProgressStatus(ApiModel):
    model_config = _LENIENT

    step: int | None = Field(default=None, description="step: training steps done (rank 0).")
    total_steps: int | None = Field(default=None, description="totalSteps: steps of the run.")
    samples_per_second: float | None = Field(
        default=None, description="samplesPerSecond: recent throughput of rank 0."
    )
    loss: float | None = Field(default=None, description="loss: the latest loss of rank 0.")
    eta_seconds: float | None = Field(
        default=None, description="etaSeconds: estimated seconds to the last step."
    )
    summary: str = Field(default="", description="summary: one line for kubectl get.")


class GoodputAttempt(ApiModel):
    """The current attempt's share of the goodput totals: the launchers count in-place
    restarts per pod, and a new gang starts them again at zero, so the share is kept
    to add only what is new."""

    model_config = _LENIENT

    attempt: int = Field(description="attempt: the attempt these counts belong to.")
    in_place_restarts: int = Field(
        default=0, description="inPlaceRestarts: in-place restarts of this attempt counted."
    )
    causes: dict[str, int] = Field(
        default_factory=dict, description="causes: of those, how many by cause."
    )
    lost_counted_through: int = Field(
        default=0,
        description="lostCountedThrough: the in-place restart of this attempt whose lost "
        "steps were last added to stepsLost.",
    )


class GoodputStatus(ApiModel):
    model_config = _LENIENT

    ratio: float | None = Field(
        default=None,
        description="ratio: productiveSeconds / wallSeconds, 0 to 1: the share of the run "
        "spent completing steps never completed before.",
    )
    productive_seconds: float = Field(
        default=0.0,
        description="productiveSeconds: time spent on new steps: each step past the highest "
        "ever reached counts the gang's median seconds per step; steps redone after a "
        "restart count nothing.",
    )
    wall_seconds: float = Field(
        default=0.0, description="wallSeconds: seconds since startTime at the last update."
    )
    highest_step: int | None = Field(
        default=None, description="highestStep: the highest step any rank has reported."
    )
    in_place_restarts: int = Field(
        default=0,
        description="inPlaceRestarts: restarts of the training processes inside the running "
        "pods (the launchers' elastic agents), over every attempt.",
    )
    in_place_restart_causes: dict[str, int] = Field(
        default_factory=dict,
        description="inPlaceRestartCauses: in-place restarts by cause: failure (a process "
        "failed), hang (a launcher found its ranks stalled).",
    )
    steps_lost: int = Field(
        default=0,
        description="stepsLost: steps done again after restarts: for each in-place restart the "
        "step before it minus the step resumed from, and for each gang recreation the highest "
        "step minus the first step the new gang reported (a lower bound).",
    )
    last_recovery_seconds: float | None = Field(
        default=None,
        description="lastRecoverySeconds: for the last in-place restart, seconds from the "
        "fault to the first new step (the launcher's clock); after a gang recreation, from "
        "the new gang's creation to its first step the operator saw.",
    )
    summary: str = Field(default="", description="summary: one line for kubectl get -o wide.")
    counted: GoodputAttempt | None = Field(
        default=None, description="counted: the current attempt's share of the counts above."
    )


class PreflightStatus(ApiModel):
    """The last judged bandwidth test; kept in the status so that failures in a row are
    counted across attempts and an operator restart does not judge a test twice."""

    model_config = _LENIENT

    attempt: int = Field(description="attempt: the gang whose test this is.")
    passed: bool = Field(description="passed: every worker was at or above the floor.")
    failures: int = Field(
        default=0,
        description="failures: tests failed in a row up to this one (0 after a pass).",
    )
    slowest_gbps: float | None = Field(
        default=None, description="slowestGbps: the lowest rank's bandwidth, Gbit/s."
    )
    median_gbps: float | None = Field(
        default=None, description="medianGbps: the median of the ranks' bandwidth, Gbit/s."
    )
    summary: str = Field(default="", description="summary: the verdict, for people.")


class PendingReplacement(ApiModel):
    """A worker being recreated alone: its old pod's UID tells the old pod from the new one,
    whose name ends with the serial (builders/names.py)."""

    model_config = _LENIENT

    rank: int = Field(description="rank: the worker replaced; its index does not change.")
    pod_uid: str = Field(
        alias="podUID",  # Kubernetes' spelling (podIP, UID), not the generator's "podUid"
        description="podUID: the lost pod's UID.",
    )
    node: str = Field(default="", description="node: the node the worker was lost with.")
    cause: str = Field(description="cause: disruption or straggler.")
    what: str = Field(default="", description="what: what happened to the worker, for people.")
    since: datetime = Field(description="since: when the replacement was decided.")
    serial: int = Field(
        default=0,
        description="serial: the replacement's number in the job, which ends the new pod's "
        "name (<job>-a<attempt>-worker-<rank>-r<serial>), so the new pod is created while the "
        "old one still terminates. 0 (an entry an earlier operator wrote): the new pod reuses "
        "the old one's name and is created once that pod is gone.",
    )


class ReplacementStatus(ApiModel):
    """Workers recreated alone (runPolicy.workerReplacement), each also counted in
    disruptions."""

    model_config = _LENIENT

    total: int = Field(default=0, description="total: workers replaced alone, over every attempt.")
    attempt: int = Field(default=0, description="attempt: the attempt inAttempt counts.")
    in_attempt: int = Field(
        default=0,
        description="inAttempt: replacements in that attempt; with its in-place restarts they "
        "are bounded by spec.runtime.inPlaceRestarts.",
    )
    pending: list[PendingReplacement] = Field(
        default_factory=list, description="pending: replacements not running yet."
    )

    def serial_of(self, rank: int, attempt: int) -> int:
        """The serial of worker `rank`'s pending replacement in `attempt`; 0 for none."""
        if self.attempt != attempt:
            return 0
        return next((p.serial for p in self.pending if p.rank == rank), 0)


class TrainingJobStatus(ApiModel):
    model_config = _LENIENT

    phase: Phase | None = Field(default=None, description="phase: where the job is now.")
    reason: str = Field(default="", description="reason: why the job is in its phase.")
    message: str = Field(default="", description="message: the latest news, for people.")
    conditions: list[Condition] = Field(
        default_factory=list,
        description="conditions, one per type.",
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["type"],
        },
    )
    attempt: int = Field(
        default=0, description="attempt: the gang incarnation the current workers belong to."
    )
    # Restarts by cause: each has its own budget in runPolicy.failurePolicy, so
    # trouble in the infrastructure never spends the user's maxRestarts.
    restarts: int = Field(
        default=0,
        description="restarts: gang restarts after worker failures, counted against maxRestarts.",
    )
    disruptions: int = Field(
        default=0,
        description="disruptions: gang restarts after a disruption (node lost or NotReady, "
        "eviction, preemption by the kube-scheduler, kubelet shutdown), counted against "
        "maxDisruptions.",
    )
    ignored_restarts: int = Field(
        default=0,
        description="ignoredRestarts: gang restarts by Ignore rules, counted against "
        "maxIgnoredRestarts.",
    )
    next_attempt_time: datetime | None = Field(
        default=None,
        description="nextAttemptTime: the new gang is not created before this time (the "
        "backoff after an Ignore restart).",
    )
    preemptions: int = Field(
        default=0,
        description="preemptions: gang restarts because a higher-priority gang preempted this "
        "one; not counted against maxRestarts.",
    )
    last_preemption_time: datetime | None = Field(
        default=None,
        description="lastPreemptionTime: when this job was last preempted; it is not preempted "
        "again within the placer's grace period.",
    )
    preempted_by: PreemptionNote | None = Field(
        default=None,
        description="preemptedBy: set by the placer when it preempts the current attempt; "
        "cleared when the job restarts.",
    )
    ready_workers: int = Field(default=0, description="readyWorkers: workers Running and ready.")
    total_workers: int = Field(default=0, description="totalWorkers: workers in the gang.")
    ready: str = Field(default="", description="ready: readyWorkers/totalWorkers, for kubectl.")
    gpus: int = Field(default=0, description="gpus: whole GPUs the job holds when running.")
    start_time: datetime | None = Field(
        default=None, description="startTime: when the current run started (reset on resume)."
    )
    attempt_start_time: datetime | None = Field(
        default=None, description="attemptStartTime: when the current gang's pods were created."
    )
    all_running_time: datetime | None = Field(
        default=None, description="allRunningTime: when every worker of the gang last ran."
    )
    completion_time: datetime | None = Field(
        default=None, description="completionTime: when the job succeeded or failed."
    )
    observed_generation: int | None = Field(
        default=None, description="observedGeneration: the spec generation last acted on."
    )
    placement: PlacementStatus | None = Field(
        default=None, description="placement: where the current gang's ranks went."
    )
    progress: ProgressStatus | None = Field(
        default=None, description="progress: what the workers' runtime reports."
    )
    isolation: str = Field(
        default="", description="isolation: what keeps this job apart from others on its GPUs."
    )
    goodput: GoodputStatus | None = Field(
        default=None,
        description="goodput: with the runtime, how much of the run made progress and what "
        "faults cost.",
    )
    preflight: PreflightStatus | None = Field(
        default=None,
        description="preflight: with runPolicy.preflight, the last gang's bandwidth test.",
    )
    replacements: ReplacementStatus | None = Field(
        default=None,
        description="replacements: with runPolicy.workerReplacement, workers recreated alone "
        "instead of the gang.",
    )

    def condition(self, kind: ConditionType) -> Condition | None:
        return next((c for c in self.conditions if c.type == kind), None)
