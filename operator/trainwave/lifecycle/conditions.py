"""Conditions keyed by type, with transition times that move only on change.

Pure.
"""

from datetime import datetime

from trainwave.api.status import Condition, ConditionType


def set_condition(
    conditions: list[Condition],
    kind: ConditionType,
    *,
    true: bool | None,
    reason: str,
    message: str,
    now: datetime,
    generation: int,
) -> list[Condition]:
    """`true` None is "Unknown": not decided yet, e.g. no proof either way so far."""
    status = "Unknown" if true is None else "True" if true else "False"
    previous = next((c for c in conditions if c.type == kind), None)
    moved = previous is None or previous.status != status
    updated = Condition(
        type=kind,
        status=status,
        reason=reason,
        message=message,
        last_transition_time=now if moved or previous is None else previous.last_transition_time,
        observed_generation=generation,
    )
    rest = [c for c in conditions if c.type != kind]
    return sorted([*rest, updated], key=lambda c: list(ConditionType).index(c.type))


def clear_condition(
    conditions: list[Condition],
    kind: ConditionType,
    *,
    reason: str,
    message: str,
    now: datetime,
    generation: int,
) -> list[Condition]:
    """Set to False only if present: absent conditions stay absent."""
    if not any(c.type == kind for c in conditions):
        return conditions
    return set_condition(
        conditions, kind, true=False, reason=reason, message=message, now=now, generation=generation
    )
