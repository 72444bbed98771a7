"""What the reconciler does with a decision: in which order, and whether its status may wait.

Pure. The rules that used to live in the controller's shell (controller/reconciler.py):

- A decision that only creates workers of the attempt the written status already
  records creates them first and writes one status counting them (the Job controller's
  order); any other decision is written first, so a new attempt is recorded before any
  of its pods exists and a lost write is decided again from the same evidence.
- A whole gang created placed may have its status held for the pods' batch period
  instead of written at once: by then the gang is usually bound and running, and one
  write says so instead of two.
- A held status's phase news is posted only if the status written next is still in
  that phase; news about the spec (`JobEvent.lasting`) is posted whatever comes next.
"""

from dataclasses import dataclass, replace

from trainwave.api.status import TrainingJobStatus
from trainwave.lifecycle.draft import Decision, JobEvent
from trainwave.lifecycle.observed import WorkerPod
from trainwave.lifecycle.workload_actions import WorkloadAction


@dataclass(frozen=True)
class Held:
    """A status decided right after a gang was created placed, not written yet."""

    uid: str
    replaced: TrainingJobStatus  # the written status it stands in for
    status: TrainingJobStatus
    # The news of the phases passed on the way to `status` ("job accepted", "0/4 workers
    # bound"): posted only if the status written next is still in that phase, since a
    # phase change no status ever showed is no news.
    events: tuple[JobEvent, ...]

    def stands_for(self, uid: str, written: TrainingJobStatus) -> bool:
        """Whether it still stands in for the job's written status: the same object, and
        nothing written meanwhile (an error report, say, which is newer)."""
        return self.uid == uid and self.replaced == written


def only_creates(decision: Decision, written: TrainingJobStatus) -> bool:
    """A decision that creates workers of the attempt the job's status already records and
    does nothing else: the status may follow the pods. A new attempt is written first, so a
    lost write is decided again from the same evidence."""
    return (
        bool(decision.create_ranks)
        and decision.status.attempt == written.attempt
        and not decision.delete_pods
        and not decision.force_delete_pods
        and decision.workload == WorkloadAction.NONE
        and not decision.delete_job
    )


def may_hold(decision: Decision, created: list[WorkerPod], workers: int) -> bool:
    """Whether the status decided after creating `created` may wait: a whole gang created
    placed (none of it gated) and nothing to do but write the status and post its news."""
    return (
        len(created) == workers
        and not any(worker.gated for worker in created)
        and not decision.create_ranks
        and not decision.delete_pods
        and not decision.force_delete_pods
        and not decision.wants_placement
        and not decision.wants_service
        and decision.workload == WorkloadAction.NONE
        and not decision.delete_job
        and decision.status.phase is not None
        and not decision.status.phase.terminal
    )


def with_held_news(decision: Decision, held: Held | None) -> Decision:
    """`decision` with the held status's news first, while it is still the news it was (the
    status to be written is in the held phase); otherwise only its lasting news (a warning
    about the spec, which the phase written next does not make stale)."""
    if held is None:
        return decision
    news = held.events
    if decision.status.phase != held.status.phase:
        news = tuple(event for event in held.events if event.lasting)
    return replace(decision, events=news + decision.events) if news else decision
