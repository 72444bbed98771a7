"""Every reason trainwave writes: status.reason, conditions' reasons and Event reasons.

One place, so lifecycle, the placer and the tests spell them the same way, and a
user's alert or script can rely on the list (the README's tables use these
strings). Reasons are CamelCase single words, as Kubernetes asks of a
condition's reason. Messages stay with the decisions that have their numbers.
"""

from enum import StrEnum


class Reason(StrEnum):
    # The job's life (lifecycle/decide.py).
    CREATED = "Created"
    CREATING_WORKERS = "CreatingWorkers"
    PLACING = "Placing"
    WAITING_FOR_NODES = "WaitingForNodes"
    ALL_WORKERS_BOUND = "AllWorkersBound"
    WORKERS_STARTING = "WorkersStarting"
    ALL_WORKERS_RUNNING = "AllWorkersRunning"
    SUCCEEDED = "Succeeded"
    SUSPENDED = "Suspended"
    RESUMED = "Resumed"
    RESTARTING = "Restarting"
    DEADLINE_EXCEEDED = "DeadlineExceeded"
    INVALID_SPEC = "InvalidSpec"

    # Kueue admission of jobs with a queue-name label (lifecycle/admission.py).
    QUEUED = "Queued"
    ADMITTED = "Admitted"
    EVICTED = "Evicted"
    # An Event only: Kueue's own reason why the job still waits, when it changes.
    KUEUE_PENDING = "KueuePending"

    # A worker in trouble and what the failure policy made of it (lifecycle/failures.py).
    WORKER_FAILED = "WorkerFailed"
    WORKER_DISRUPTED = "WorkerDisrupted"
    FAILURE_IGNORED = "FailureIgnored"
    FAILED_BY_RULE = "FailedByRule"
    MAX_RESTARTS_EXCEEDED = "MaxRestartsExceeded"
    MAX_DISRUPTIONS_EXCEEDED = "MaxDisruptionsExceeded"
    MAX_IGNORED_RESTARTS_EXCEEDED = "MaxIgnoredRestartsExceeded"

    # Children the API server refused (lifecycle/children.py), and the net under every
    # error nobody planned for (lifecycle/errors.py).
    FAILED_CREATE = "FailedCreate"
    RECONCILE_ERROR = "ReconcileError"
    RECONCILED = "Reconciled"

    # A worker-container resource the user wrote that trainwave replaced (resolving.py,
    # lifecycle/decide.py), and its condition turning False once the spec agrees.
    RESOURCES_OVERRIDDEN = "ResourcesOverridden"
    RESOURCES_AS_WRITTEN = "ResourcesAsWritten"

    # Placement: why a gang waits or cannot run (placement/, lifecycle/placing.py).
    INVALID_REQUEST = "InvalidRequest"
    NO_MATCHING_NODES = "NoMatchingNodes"
    WORKER_TOO_LARGE = "WorkerTooLarge"
    NOT_ENOUGH_GPUS = "NotEnoughGPUs"
    NOT_ENOUGH_RESOURCES = "NotEnoughResources"
    PARALLELISM_DOES_NOT_FIT = "ParallelismDoesNotFit"
    REQUIRED_DOMAIN_TOO_SMALL = "RequiredDomainTooSmall"
    TOPOLOGY_SPREAD = "TopologySpreadNotMet"
    HELD_FOR_EARLIER_JOB = "HeldForEarlierJob"
    NEVER_FITS = "NeverFits"
    WAITING_FOR_PREFERRED_LEVEL = "WaitingForPreferredLevel"
    LARGER_THAN_ANY_GPU = "LargerThanAnyGPU"
    RDMA_UNAVAILABLE = "RDMAUnavailable"
    BIND_TIMEOUT = "BindTimeout"
    PREEMPTING = "Preempting"
    PREEMPTED = "Preempted"

    # What the workers' own reports prove (lifecycle/reports.py).
    GPUDIRECT_IN_USE = "GPUDirectInUse"
    NOT_GPUDIRECT = "NotGPUDirect"
    DOCTOR_FAILED = "DoctorFailed"
    WAITING_FOR_PROOF = "WaitingForProof"

    # Goodput from the runtime's reports (lifecycle/goodput.py): a hang, its end, and the
    # gang recreated when the launchers could not repair it; stragglers.
    HUNG = "Hung"
    PROGRESS_RESUMED = "ProgressResumed"
    STRAGGLER = "Straggler"
    NO_STRAGGLER = "NoStraggler"
    STRAGGLER_REPLACED = "StragglerReplaced"
    # runPolicy.preflight (lifecycle/preflight.py): the gang's links before training.
    PREFLIGHT_PASSED = "PreflightPassed"
    PREFLIGHT_FAILED = "PreflightFailed"  # a node below the floor; the gang re-placed without it
    PREFLIGHT_ERROR = "PreflightError"  # a launcher's test failed or timed out: no verdict
    PREFLIGHT_FAILURES_EXCEEDED = "PreflightFailuresExceeded"  # trains where it is
    RESTARTED_IN_PLACE = "RestartedInPlace"  # an Event: the launchers restarted the processes
    # runPolicy.workerReplacement (lifecycle/replacing.py): one lost worker recreated alone.
    REPLACING_WORKER = "ReplacingWorker"
    WORKER_REPLACED = "WorkerReplaced"
    REPLACEMENT_TIMED_OUT = "ReplacementTimedOut"  # not running in time: the gang is recreated
