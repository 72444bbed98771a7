"""The `runtime` block of a TrainingJob: the acceleration runtime injected into workers. Pure.

With the block present (and `enabled`), the operator copies trainwave's runtime
into every worker through an init container, and starts the user's command
under its launcher: zero-code features apply at once, the three-line API
(`prepare`, `backward`, `accumulate`) is importable, and the worker reports
progress and its GPUDirect doctor back to the job's status.
"""

from typing import Literal

from pydantic import Field

from trainwave import contract
from trainwave.api.base import ApiModel

Mode = Literal["on", "off", "auto"]
CompressionMode = Literal["off", "auto", "fp16", "bf16", "powersgd"]
DEFAULT_IN_PLACE_RESTARTS = 3


class Features(ApiModel):
    """Each feature on, off or auto (the runtime decides from the hardware and topology)."""

    tf32: Mode = Field(default="auto", description="tf32: TF32 matmuls on Ampere and newer.")
    amp: Mode = Field(default="auto", description="amp: automatic mixed precision.")
    fused_optimizer: Mode = Field(
        default="auto", description="fusedOptimizer: fused/foreach optimizer kernels."
    )
    ddp_buckets: Mode = Field(default="auto", description="ddpBuckets: tuned DDP bucket sizes.")
    compression: CompressionMode = Field(
        default="auto",
        description="compression: gradient compression (fp16, bf16, powersgd); auto compresses "
        "only when the inter-node link is slow.",
    )
    hierarchical_allreduce: Mode = Field(
        default="auto",
        description="hierarchicalAllreduce: reduce inside nodes first; auto when it pays.",
    )
    prefetch: Mode = Field(default="auto", description="prefetch: data-loader prefetching.")
    length_grouping: Mode = Field(
        default="off", description="lengthGrouping: balance variable-length batches."
    )
    checkpoint: Mode = Field(default="auto", description="checkpoint: periodic checkpoints.")
    doctor: Mode = Field(
        default="auto",
        description="doctor: the GPUDirect checklist at start; on fails the worker on a FAIL.",
    )
    telemetry: Mode = Field(default="auto", description="telemetry: progress and GPU use.")
    cuda_graphs: Mode = Field(default="off", description="cudaGraphs: capture CUDA graphs.")
    compile: Mode = Field(default="off", description="compile: torch.compile the model.")
    submodel: Mode = Field(
        default="auto",
        description="submodel: hold a shared-GPU worker to its memory budget in prepare(): "
        "cap the caching allocator and train through the submodel allocator when the model's "
        "measured peak exceeds the budget (auto), always (on), or not at all (off). Without a "
        "budget (whole GPUs) it does nothing.",
    )
    warm_start: Mode = Field(
        default="auto",
        description="warmStart: with in-place restarts, start each new generation of training "
        "processes by forking a process that already imported torch (torch's forkserver start "
        "method, the script run in it as torchrun --run-path does), instead of a fresh python "
        "that imports torch again; auto and on do this for a Python script (`train.py`, "
        "`python train.py`, `torchrun train.py`), off starts a fresh interpreter each time.",
    )


class Checkpointing(ApiModel):
    path: str = Field(
        min_length=1,
        max_length=4096,
        pattern=r"^/",
        description="path: absolute directory inside the worker (a mounted volume) that "
        "checkpoints go to; after a gang restart the job resumes from the latest.",
    )
    every_steps: int = Field(
        default=500, ge=1, description="everySteps: steps between checkpoints. Default 500."
    )
    keep: int = Field(default=3, ge=1, le=1000, description="keep: newest checkpoints kept.")


class RuntimeSpec(ApiModel):
    enabled: bool = Field(default=True, description="enabled: inject the runtime. Default true.")
    image: str | None = Field(
        default=None,
        max_length=1024,
        description="image: the runtime image for the init container; default the "
        "operator's (Helm value runtime.image).",
    )
    python: str = Field(
        default="python",
        min_length=1,
        max_length=256,
        description="python: the interpreter in the worker image that runs the launcher.",
    )
    features: Features = Field(
        default_factory=Features,
        description="features: each acceleration feature on, off or auto.",
        json_schema_extra={"default": {}},
    )
    checkpoint: Checkpointing | None = Field(
        default=None, description="checkpoint: where and how often to checkpoint."
    )
    total_steps: int | None = Field(
        default=None,
        ge=1,
        description="totalSteps: steps of the whole run, for progress and ETA.",
    )
    in_place_restarts: int = Field(
        default=DEFAULT_IN_PLACE_RESTARTS,
        ge=0,
        le=100,
        description="inPlaceRestarts: how many times a failed or hung training process is "
        "restarted inside the running pods (torch's elastic agent: every worker's processes "
        "re-enter rendezvous and resume from the newest checkpoint) before the pod fails and "
        f"the gang is recreated as without the runtime. 0 turns it off. Default "
        f"{DEFAULT_IN_PLACE_RESTARTS}.",
    )
    status_port: int = Field(
        default=contract.DEFAULT_STATUS_PORT,
        ge=1024,
        le=65535,
        description="statusPort: the launcher's status port in each worker.",
    )
