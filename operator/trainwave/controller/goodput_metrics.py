"""Prometheus metrics of goodput, from one status write: hangs, stragglers, in-place
restarts by cause (lifecycle/goodput.py decides them) and preflight tests by result
(lifecycle/preflight.py). Each job's goodput ratio is read from the job index at scrape
time instead (metrics.JobGoodput)."""

from trainwave.api.reasons import Reason
from trainwave.api.status import ConditionType, TrainingJobStatus
from trainwave.controller import metrics
from trainwave.lifecycle.draft import Decision


def record_goodput(old: TrainingJobStatus, decision: Decision) -> None:
    """Count what this written decision adds: a Hung condition turning True is a hang (the
    gang recreated for it later posts a phase Event of the same reason, not a new hang);
    each Straggler Event names one new rank; the in-place counts say which restarts are."""
    if _hung(decision.status) and not _hung(old):
        metrics.HANGS.inc()
    for event in decision.events:
        if event.reason == Reason.STRAGGLER:
            metrics.STRAGGLERS.inc()
    found = decision.status.preflight
    if found is not None and (old.preflight is None or old.preflight.attempt != found.attempt):
        condition = decision.status.condition(ConditionType.PREFLIGHT)
        errors = condition is not None and condition.reason == Reason.PREFLIGHT_ERROR
        result = "passed" if found.passed else "error" if errors else "failed"
        metrics.PREFLIGHT_TESTS.labels(result).inc()
    new = decision.status.goodput
    if new is None:
        return
    before = old.goodput.in_place_restart_causes if old.goodput is not None else {}
    for cause in metrics.IN_PLACE_CAUSES:  # a status written by hand adds no label
        count = new.in_place_restart_causes.get(cause, 0)
        if count > before.get(cause, 0):
            metrics.IN_PLACE_RESTARTS.labels(cause).inc(count - before.get(cause, 0))


def _hung(status: TrainingJobStatus) -> bool:
    found = status.condition(ConditionType.HUNG)
    return found is not None and found.status == "True"
