"""What every pod mutator is handed: which worker of which job it is building. Pure."""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trainwave import contract
from trainwave.api.trainingjob import TrainingJob


@dataclass(frozen=True)
class Worker:
    job: TrainingJob
    rank: int
    attempt: int
    # The operator's default runtime image (Helm value runtime.image).
    runtime_image: str = contract.DEFAULT_RUNTIME_IMAGE


Mutator = Callable[[dict[str, Any], Worker], None]
