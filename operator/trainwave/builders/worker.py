"""What every pod mutator is handed: which worker of which job it is building. Pure."""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trainwave import contract
from trainwave.api.sharing import SharedSetup
from trainwave.api.trainingjob import TrainingJob


@dataclass(frozen=True)
class Worker:
    job: TrainingJob
    rank: int
    attempt: int
    # The operator's default runtime image (Helm value runtime.image).
    runtime_image: str = contract.DEFAULT_RUNTIME_IMAGE
    setup: SharedSetup | None = None  # what a shared worker is given (resolving.py)


Mutator = Callable[[dict[str, Any], Worker], None]
