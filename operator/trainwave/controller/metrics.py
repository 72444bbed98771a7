"""Prometheus metrics of the operator.

Jobs by phase are read from the live index at scrape time rather than kept as
counters, so the numbers are right after a restart without any bookkeeping.
"""

from collections.abc import Callable, Iterator, Mapping

from prometheus_client import REGISTRY, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from trainwave.api.status import Phase

RECONCILE_SECONDS = Histogram(
    "trainwave_reconcile_duration_seconds",
    "Time to reconcile one TrainingJob: read, decide, write.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
RECONCILE_ERRORS = Counter(
    "trainwave_reconcile_errors_total", "Reconciles that raised and were retried."
)
ALL_RUNNING_SECONDS = Histogram(
    "trainwave_time_to_all_workers_running_seconds",
    "From the start of a gang (first pod created) to every worker Running.",
    buckets=(0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800),
)
PHASE_TRANSITIONS = Counter(
    "trainwave_job_phase_transitions_total",
    "TrainingJob phase changes, by the phase entered.",
    ["phase"],
)
GANG_RESTARTS = Counter(
    "trainwave_gang_restarts_total", "Gang restarts started after a worker failed."
)

GANGS_PLACED = Counter(
    "trainwave_gangs_placed_total", "Gangs the placer released onto the nodes it chose."
)
GANGS_WAITING = Gauge(
    "trainwave_gangs_waiting", "Gangs behind the scheduling gate after the last placement round."
)
GANGS_PREEMPTED = Counter(
    "trainwave_gangs_preempted_total",
    "Running gangs evicted for a waiting gang of higher priority.",
)
PLACEMENT_ROUND_SECONDS = Histogram(
    "trainwave_placement_round_duration_seconds",
    "One placement round: read the cache, decide the round, release admitted gangs.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)


class JobsByPhase(Collector):
    """trainwave_jobs{phase}: how many TrainingJobs are in each phase now."""

    def __init__(self, phases: Callable[[], Mapping[str, int]]):
        self._phases = phases

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily("trainwave_jobs", "TrainingJobs by phase.", labels=["phase"])
        counts = self._phases()
        for phase in Phase:
            family.add_metric([phase.value], counts.get(phase.value, 0))
        yield family


def serve(port: int, phases: Callable[[], Mapping[str, int]]) -> None:
    REGISTRY.register(JobsByPhase(phases))
    start_http_server(port)
