"""What every pod mutator is handed: which worker of which job it is building. Pure."""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trainwave import contract
from trainwave.api.trainingjob import TrainingJob
from trainwave.sizing.requests import SharedMemory


@dataclass(frozen=True)
class Worker:
    job: TrainingJob
    rank: int
    attempt: int
    # The operator's default runtime image (Helm value runtime.image).
    runtime_image: str = contract.DEFAULT_RUNTIME_IMAGE
    shared: SharedMemory | None = None  # the resolved gpuSharing request (resolving.py)


Mutator = Callable[[dict[str, Any], Worker], None]
