"""The `placement` block of a TrainingJob: where its gang may and should go. Pure.

Levels are named by the short name of a topology level ("rack", "spine",
"host", "nvlink") or by its node-label key; the operator resolves them
against the levels it was configured with (Helm value `topology.levels`) and
refuses an unknown one with the list it knows.
"""

from pydantic import ConfigDict, Field

from trainwave.api.base import ApiModel, cel, validations

LEVEL_PATTERN = r"^[a-z0-9]([-a-z0-9./]*[a-z0-9])?$"
MAX_PRIORITY = 1_000_000


class Parallelism(ApiModel):
    tensor: int = Field(
        default=1,
        ge=1,
        le=1024,
        description="tensor: tensor-parallel degree in processes; each group of this many "
        "consecutive ranks stays inside one NVLink domain (or node).",
    )
    pipeline: int = Field(
        default=1,
        ge=1,
        le=1024,
        description="pipeline: pipeline stages per model replica; one replica (tensor x "
        "pipeline ranks) stays inside one rack.",
    )


class PlacementSpec(ApiModel):
    model_config = ConfigDict(
        **ApiModel.model_config,
        json_schema_extra=validations(
            cel(
                "!has(self.requiredLevel) || !has(self.preferredLevel) || "
                "self.requiredLevel != self.preferredLevel",
                "spec.placement.preferredLevel must differ from requiredLevel: a level that is "
                "required is already met",
                ".preferredLevel",
            )
        ),
    )

    required_level: str | None = Field(
        default=None,
        max_length=253,
        pattern=LEVEL_PATTERN,
        description="requiredLevel: every worker must be inside one domain of this topology "
        "level (e.g. rack); the gang waits until one has room.",
    )
    preferred_level: str | None = Field(
        default=None,
        max_length=253,
        pattern=LEVEL_PATTERN,
        description="preferredLevel: keep the gang inside one domain of this level when one "
        "has room, else use as few as possible. Default: the level just above hosts.",
    )
    priority: int = Field(
        default=0,
        ge=-MAX_PRIORITY,
        le=MAX_PRIORITY,
        description="priority: higher starts first among waiting gangs; equal priorities "
        "start in arrival order, with bounded backfill.",
    )
    preemptible: bool = Field(
        default=True,
        description="preemptible: whether a waiting gang of higher priority may preempt this "
        "one (the whole gang, restarted later as a new attempt that does not count against "
        "maxRestarts). A PriorityClass with preemptionPolicy Never also protects it.",
    )
    parallelism: Parallelism | None = Field(
        default=None,
        description="parallelism: tensor and pipeline degrees, so ranks are grouped to match "
        "the network (the data-parallel degree follows from the world size).",
    )
    preferred_level_wait_seconds: int = Field(
        default=10,
        ge=0,
        le=3_600,
        description="preferredLevelWaitSeconds: how long a gang that could fit one domain of "
        "its preferred level, but finds none with room now, waits for one before it starts "
        "spread over several (Slurm's --switches=count@max-time). 0: spread at once. Not "
        "waited while other gangs wait for room behind it, nor by a gang whose reserved "
        "room is complete: idle GPUs would cost more than the locality.",
    )
    bind_timeout_seconds: int = Field(
        default=120,
        ge=5,
        le=86_400,
        description="bindTimeoutSeconds: after the gang was placed, how long its pods may "
        "stay unbound (someone else took the room) before the operator re-plans it.",
    )
