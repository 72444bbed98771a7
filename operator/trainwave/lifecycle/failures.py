"""The failure policy: what one failed worker does to its gang.

Pure. Rules are tried in order on the worker that failed first; the first
match decides, and a failure no rule matches restarts the gang, because NCCL
ranks cannot carry on without a peer.
"""

from dataclasses import dataclass

from trainwave.api.spec import FailureAction, FailurePolicy, FailureRule
from trainwave.lifecycle.observed import WorkerPod


@dataclass(frozen=True)
class FailureVerdict:
    action: FailureAction
    counted: bool
    rule_index: int | None
    culprit: WorkerPod

    def describe(self) -> str:
        code = (
            f"exited with code {self.culprit.exit_code}"
            if self.culprit.exit_code is not None
            else f"failed ({self.culprit.reason or 'no exit code'})"
        )
        rule = (
            f" (failurePolicy.rules[{self.rule_index}]: {self.action})"
            if self.rule_index is not None
            else ""
        )
        return f"worker {self.culprit.rank} ({self.culprit.name}) {code}{rule}"


def first_failure(failed: list[WorkerPod]) -> WorkerPod:
    """The worker that failed first: the root cause; later ones often just lost a peer."""
    return min(
        failed,
        key=lambda p: (
            p.finished_at is None,
            p.finished_at.timestamp() if p.finished_at else 0.0,
            p.rank,
        ),
    )


def judge_failure(policy: FailurePolicy, failed: list[WorkerPod]) -> FailureVerdict:
    culprit = first_failure(failed)
    for index, rule in enumerate(policy.rules):
        if _matches(rule, culprit.exit_code):
            return FailureVerdict(
                action=rule.action,
                counted=rule.action == "RestartGang",
                rule_index=index,
                culprit=culprit,
            )
    return FailureVerdict(action="RestartGang", counted=True, rule_index=None, culprit=culprit)


def _matches(rule: FailureRule, exit_code: int | None) -> bool:
    # A pod that failed without a container exit code (evicted, lost node) is
    # matched by no exit-code rule and falls through to the default.
    if exit_code is None:
        return False
    listed = exit_code in rule.on_exit_codes.values
    return listed if rule.on_exit_codes.operator == "In" else not listed
