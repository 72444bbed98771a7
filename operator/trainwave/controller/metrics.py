"""Prometheus metrics of the operator.

Jobs by phase are read from the live index at scrape time rather than kept as
counters, so the numbers are right after a restart without any bookkeeping.
"""

import collections
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from prometheus_client import REGISTRY, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from trainwave.api.status import Phase
from trainwave.placement.occupancy import DomainGpus, SharedFragmentation

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
    "trainwave_gang_restarts_total",
    "Gangs started again as a new attempt, by cause: failure (counted against maxRestarts), "
    "disruption (node lost, eviction: not counted), preemption, ignored (a failure the "
    "policy ignores), hang (still hung a full hangTimeoutSeconds after the Hung condition; "
    "counted against maxRestarts), straggler (replaced with stragglers.replace; counted "
    "against maxDisruptions), preflight (a node below runPolicy.preflight's floor; counted "
    "against maxDisruptions).",
    ["cause"],
)
RESTART_CAUSES = (
    "failure",
    "disruption",
    "preemption",
    "ignored",
    "hang",
    "straggler",
    "preflight",
)
for _cause in RESTART_CAUSES:  # every cause scraped from the start, at 0: rate() needs a base
    GANG_RESTARTS.labels(_cause)

# Goodput (lifecycle/goodput.py), from the runtime's reports.
WORKERS_REPLACED = Counter(
    "trainwave_workers_replaced_total",
    "Workers recreated alone while the rest of the gang kept its pods "
    "(runPolicy.workerReplacement), by cause: disruption (node lost or NotReady, drain, "
    "eviction, pod deleted) or straggler. Each is also a disruption of the job, not a gang "
    "restart.",
    ["cause"],
)
for _cause in ("disruption", "straggler"):
    WORKERS_REPLACED.labels(_cause)
HANGS = Counter(
    "trainwave_hangs_total",
    "Times a running gang was found hung: no rank completed a step for hangTimeoutSeconds.",
)
STRAGGLERS = Counter(
    "trainwave_stragglers_total",
    "Ranks newly named in a Straggler condition (slower than the gang's median).",
)
IN_PLACE_RESTARTS = Counter(
    "trainwave_in_place_restarts_total",
    "Restarts of the training processes inside running pods (the launchers' elastic "
    "agents), by cause: failure (a process failed), hang (a launcher found its ranks stalled).",
    ["cause"],
)
IN_PLACE_CAUSES = ("failure", "hang")
PREFLIGHT_TESTS = Counter(
    "trainwave_preflight_tests_total",
    "Gang bandwidth tests judged (runPolicy.preflight), by result: passed, failed (a node "
    "below the floor), error (a launcher's test gave no figures).",
    ["result"],
)
PREFLIGHT_RESULTS = ("passed", "failed", "error")
for _result in PREFLIGHT_RESULTS:
    PREFLIGHT_TESTS.labels(_result)
for _cause in IN_PLACE_CAUSES:
    IN_PLACE_RESTARTS.labels(_cause)

# One per worker status read. "ok" is a report taken; "unsigned", "forged" and
# "wrong_identity" are reports refused because they could not be trusted as the
# worker's own, the rest are reads that gave nothing (see controller/fetching.py).
STATUS_READS = Counter(
    "trainwave_status_reads_total",
    "Worker /status reads by outcome: ok, unreachable, slow, too_large, http_error, "
    "malformed, unsigned, forged, wrong_identity.",
    ["outcome"],
)

LEADER = Gauge(
    "trainwave_leader",
    "1 while this replica holds the leader Lease and acts; 0 on a standby, which only watches.",
)

GANGS_PLACED = Counter(
    "trainwave_gangs_placed_total", "Gangs the placer released onto the nodes it chose."
)
GANGS_PLACED_AT_CREATION = Counter(
    "trainwave_gangs_placed_at_creation_total",
    "Of the gangs placed, those created pinned because they fit at once (no gate, no release).",
)
CREATION_DRY_RUNS = Counter(
    "trainwave_creation_dry_runs_total",
    "Server-side dry runs of a gang's first placed pod, made while a mutating webhook may "
    "change pods on their way in, by what they found: unchanged (created placed), changed or "
    "failed (created behind the gate).",
    ["result"],
)
GANGS_ON_HELD_ROOM = Counter(
    "trainwave_gangs_backfilled_on_held_room_total",
    "Of the gangs placed, those started on room held for a protected gang because their "
    "runPolicy.maxRunSeconds ends them before it could start (queue rule 9).",
)
GANGS_WAITING = Gauge(
    "trainwave_gangs_waiting", "Gangs behind the scheduling gate after the last placement round."
)
GANGS_PREEMPTED = Counter(
    "trainwave_gangs_preempted_total",
    "Running gangs evicted for a waiting gang of higher priority.",
)
# Fine around the 250 ms goal, so quantiles read from the buckets are close.
# fmt: off
ROUND_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75,
    1, 1.5, 2, 3, 5, 7.5, 10,
)
# fmt: on
PLACEMENT_DECISION_SECONDS = Histogram(
    "trainwave_placement_decision_seconds",
    "The pure part of a placement round: the snapshot and plan_round(), no API calls.",
    buckets=(0.001, 0.0025, *ROUND_BUCKETS),
)
PLACEMENT_ROUND_SECONDS = Histogram(
    "trainwave_placement_round_duration_seconds",
    "One placement round: read the cache, decide the round, release admitted gangs.",
    buckets=ROUND_BUCKETS,
)


@dataclass(frozen=True)
class PlacementState:
    """What the last placement round saw, published whole so a scrape never reads half."""

    waiting: tuple[tuple[str, str, str, float], ...] = ()  # namespace, job, code, since (epoch)
    gpus: tuple[DomainGpus, ...] = ()
    shared: SharedFragmentation = field(default_factory=SharedFragmentation)


class PlacementGauges(Collector):
    """Gauges from the placer's view, set at the end of a round (placer.py):

    trainwave_gangs_waiting_by_reason{reason}, trainwave_gang_waiting_seconds{job_namespace,
    job_name} (the alert on gangs waiting too long), trainwave_gpus{level,domain,state} and
    trainwave_shared_gpu_{count,idle_milli,fragmented_milli}. Job labels are not `namespace`
    and `job`: Prometheus sets those on every target and would rename ours."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.state = PlacementState()
        self._clock = clock

    def collect(self) -> Iterator[GaugeMetricFamily]:
        state, now = self.state, self._clock()
        reasons = GaugeMetricFamily(
            "trainwave_gangs_waiting_by_reason",
            "Gangs waiting for a place after the last placement round, by reason code.",
            labels=["reason"],
        )
        by_code = collections.Counter(code for _, _, code, _ in state.waiting)
        for code, count in sorted(by_code.items()):
            reasons.add_metric([code], count)
        waited = GaugeMetricFamily(
            "trainwave_gang_waiting_seconds",
            "Seconds each waiting gang's attempt has waited for a place (since this operator "
            "instance first saw it wait).",
            labels=["job_namespace", "job_name", "reason"],
        )
        for namespace, name, code, since in state.waiting:
            waited.add_metric([namespace, name, code], max(0.0, now - since))
        gpus = GaugeMetricFamily(
            "trainwave_gpus",
            "Whole GPUs per topology domain above the node: allocated, free, or unavailable "
            "(cordoned, not Ready).",
            labels=["level", "domain", "state"],
        )
        for row in state.gpus:
            gpus.add_metric([row.level, row.domain, row.state], row.gpus)
        yield from (reasons, waited, gpus)
        yield GaugeMetricFamily(
            "trainwave_shared_gpus", "GPUs offered for sharing.", value=state.shared.gpus
        )
        yield GaugeMetricFamily(
            "trainwave_shared_gpu_idle_milli",
            "Free milli-GPU summed over the GPUs offered for sharing.",
            value=state.shared.idle_milli,
        )
        yield GaugeMetricFamily(
            "trainwave_shared_gpu_fragmented_milli",
            "Of the idle shared milli-GPU, what the typical next task could not use (FGD).",
            value=state.shared.fragmented_milli,
        )


PLACEMENT = PlacementGauges()
REGISTRY.register(PLACEMENT)


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


class CacheStats(Collector):
    """trainwave_cache_objects{kind} and trainwave_cache_relists_total{kind}, read from the
    cluster cache at scrape time. Relists climbing steadily mean its watches keep failing."""

    def __init__(self, stats: Callable[[], Mapping[str, tuple[int, int]]]):
        self._stats = stats

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        objects = GaugeMetricFamily(
            "trainwave_cache_objects", "Objects held by the cluster cache.", labels=["kind"]
        )
        relists = CounterMetricFamily(
            "trainwave_cache_relists",
            "LISTs that replaced a cluster cache store after its watch failed or expired.",
            labels=["kind"],
        )
        for kind, (count, relisted) in sorted(self._stats().items()):
            objects.add_metric([kind], count)
            relists.add_metric([kind], relisted)
        yield objects
        yield relists


class JobGoodput(Collector):
    """trainwave_job_goodput_ratio{job_namespace, job_name}: each job's status.goodput.ratio,
    read from the job index at scrape time (right after a restart, gone with the job)."""

    def __init__(self, ratios: Callable[[], Iterable[tuple[str, str, float]]]):
        self._ratios = ratios

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "trainwave_job_goodput_ratio",
            "status.goodput.ratio of each job with the runtime: productive step time over "
            "wall time since its start.",
            labels=["job_namespace", "job_name"],
        )
        for namespace, name, ratio in self._ratios():
            family.add_metric([namespace, name], ratio)
        yield family


def serve(
    port: int,
    phases: Callable[[], Mapping[str, int]],
    cache: Callable[[], Mapping[str, tuple[int, int]]] | None = None,
    goodput: Callable[[], Iterable[tuple[str, str, float]]] | None = None,
) -> None:
    REGISTRY.register(JobsByPhase(phases))
    if cache is not None:
        REGISTRY.register(CacheStats(cache))
    if goodput is not None:
        REGISTRY.register(JobGoodput(goodput))
    start_http_server(port)
