"""What every pod mutator is handed: which worker of which job it is building. Pure."""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trainwave.api.trainingjob import TrainingJob


@dataclass(frozen=True)
class Worker:
    job: TrainingJob
    rank: int
    attempt: int


Mutator = Callable[[dict[str, Any], Worker], None]
