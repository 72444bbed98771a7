"""The queue: which pending gangs start now, and why the others wait. Pure.

`schedule(snapshot, pending)` decides one round. The controller calls it with every gang
that has no place yet and acts on the answer; nothing here remembers anything between
rounds except what the caller carries back in `PendingJob.skipped`.

Order: priority, higher first; then arrival, earlier first; then key.

Rules:
1. Gangs are tried in order, each against the GPUs the gangs admitted before it left. A
   gang starts whole or not at all, so two gangs that each fit alone but not together never
   both hold half a place: the first in order starts, the second waits with its reason.
2. A gang that does not fit now but would fit the empty cluster is *blocked*. Gangs behind
   it may still start (backfill). Each time one starts on a node a blocked gang could use,
   that blocked gang counts one skip.
3. Bounded backfill. A blocked gang skipped `max_skips` times is *protected*: from then on,
   gangs behind it start only on nodes it can never use (outside its node selector, or
   with fewer GPUs than one of its workers). Everything it could use is held for it, so as
   running jobs finish its room only grows, and no stream of smaller jobs can starve it.
   `max_skips=0` is strict FIFO.
4. A gang that would not fit even the empty cluster blocks nobody; its reason says so.
5. Priority is absolute: a higher-priority gang comes earlier in the order, is no backfill,
   and may take room a protected lower-priority gang waits for (preemption of running
   gangs is decided after the queue, in preemption.py).
6. Whole-GPU and shared-GPU gangs are one queue under the same rules: a shared gang
   (`request.shared_mib`) is placed GPU by GPU by the packer (sharing.py) on the same
   working snapshot, so neither kind can starve the other.
7. A gang that would start spread over several domains of its preferred level only
   because the one domain with room for it is held (rule 3) waits instead: starting
   scattered would cost it for its whole run, waiting costs it until the held gang starts.
8. A gang the caller has not yet allowed to spread (`PendingJob.may_spread`, false while
   its preferredLevelWaitSeconds run) that would start spread over several domains of its
   preferred level, but would fit one domain of the empty cluster, waits for one to free
   up. It blocks nobody: the caller bounds the wait, as Slurm's `--switches=count@max-time`.
   Two cases skip that wait, so that it never idles GPUs a queue is waiting for:
   a. a *protected* gang (rule 3) starts as soon as its room is complete, spread or not:
      it was overtaken `max_skips` times already, and a gang waiting by choice holds
      nothing, so later gangs would take the room it accumulated;
   b. a gang behind which other gangs still wait for room at the end of the round (the
      cluster is saturated) starts spread at once: the room it would leave either idles
      while the queue grows or goes to a later gang that overtakes it. This is Kueue's
      topology-aware scheduling's rule for a preferred level (podset-preferred-topology:
      the smallest domain that fits now, else spread; admission never waits for one).
      Whether gangs wait behind it depends on whether it starts, so the round is decided
      again with the waived gangs allowed to spread, until no new gang qualifies (each
      pass waives at least one more gang, so at most one pass per rule-8 gang).
9. Backfill that cannot delay (EASY backfill, as Slurm's backfill scheduler with time
   limits). A gang with a run bound (`PendingJob.max_run`: runPolicy.maxRunSeconds,
   which the operator enforces from the gang's release) may start on room held for a
   protected gang (rule 3) when it will be gone before that gang could start anyway:
   its bound, from now, plus `QueuePolicy.backfill_margin`, is no later than the
   protected gang's *shadow time*, the earliest moment its room is complete if every
   gang holding its nodes ends by its own bound (backfill.py). Anything without a bound
   never ends in that count, so a protected gang among unbounded gangs has no shadow time
   and keeps its room as in rule 3. Tried only when the gang does not fit (or fits only
   spread) outside the held room. Held room it takes counts no skip against anyone: it
   is free again before the protected gang starts, so before any gang the hold keeps
   back could use it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from functools import partial

from trainwave.api.reasons import Reason
from trainwave.placement import explain
from trainwave.placement.backfill import HeldRoom, RunBounds, ShadowClock
from trainwave.placement.gang import place
from trainwave.placement.gang_types import Blocker, GangRequest, Placement, Unschedulable
from trainwave.placement.shared_tasks import SharedShape
from trainwave.placement.sharing import (
    LARGER_THAN_ANY_GPU,
    SharedPlacement,
    SharedRefusal,
    place_shared_gang,
)
from trainwave.placement.snapshot import ClusterSnapshot

HELD_FOR_EARLIER_JOB = Reason.HELD_FOR_EARLIER_JOB
NEVER_FITS = Reason.NEVER_FITS
WAITING_FOR_PREFERRED_LEVEL = Reason.WAITING_FOR_PREFERRED_LEVEL


@dataclass(frozen=True)
class PendingJob:
    key: str  # namespace/name
    request: GangRequest
    priority: int = 0
    arrival: float = 0.0  # creation time, or any number that grows with arrival
    skipped: int = 0  # from the previous round's Wait; 0 for a new job
    may_spread: bool = True  # False: rule 8, wait for one preferred domain with room
    max_run: float | None = None  # seconds it may run once placed (rule 9); None: unbounded


# Rule 3's bound: enough for small gangs to fill the room a large gang cannot use yet, few
# enough that the large gang's wait stays bounded (the operator's --queue-max-skips).
DEFAULT_MAX_SKIPS = 4


# Rule 9's slack on a backfilled gang's bound: its release is written after the round (a
# patch per pod, seconds on a busy API server) and its clock starts then, in whole seconds.
DEFAULT_BACKFILL_MARGIN = 5.0


@dataclass(frozen=True)
class QueuePolicy:
    max_skips: int = DEFAULT_MAX_SKIPS
    backfill_margin: float = DEFAULT_BACKFILL_MARGIN


@dataclass(frozen=True)
class Admit:
    job: PendingJob
    placement: Placement | SharedPlacement
    backfilled: bool  # started while a gang ahead of it waited
    on_held_room: bool = False  # rule 9: on room held for a protected gang, gone before it starts


@dataclass(frozen=True)
class Wait:
    job: PendingJob
    code: str  # a Blocker, HELD_FOR_EARLIER_JOB or NEVER_FITS
    reason: str
    skipped: int  # carry into the next round as PendingJob.skipped


@dataclass(frozen=True)
class Schedule:
    decisions: tuple[Admit | Wait, ...]  # in queue order
    snapshot: ClusterSnapshot  # with the admitted gangs' GPUs in use

    @property
    def admitted(self) -> tuple[Admit, ...]:
        return tuple(d for d in self.decisions if isinstance(d, Admit))

    @property
    def waiting(self) -> tuple[Wait, ...]:
        return tuple(d for d in self.decisions if isinstance(d, Wait))


@dataclass
class _Blocked:
    job: PendingJob
    usable: frozenset[str]
    skipped: int
    code: str
    reason: str


def schedule(
    snapshot: ClusterSnapshot,
    pending: Iterable[PendingJob],
    policy: QueuePolicy | None = None,
    shared_shapes: Iterable[SharedShape] = (),
    bounds: RunBounds | None = None,
) -> Schedule:
    """One round: admit what fits, in order, within the backfill bound.

    `shared_shapes`: the GPU memory and CPU of the shared workers running now, which the
    packer's fragmentation measure weighs against. `bounds`: the running gangs' ends, for
    rule 9; without them no gang starts on held room.
    """
    active = tuple(shared_shapes)
    policy = policy or QueuePolicy()
    limit = policy.max_skips
    order = sorted(pending, key=lambda job: (-job.priority, job.arrival, job.key))
    memo = _Memo(snapshot)
    waived: frozenset[str] = frozenset()
    while True:
        easy = (
            ShadowClock(bounds, policy.backfill_margin, partial(_fits, active=active))
            if bounds is not None
            else None
        )
        decisions, working = _one_pass(
            snapshot, order, limit=limit, active=active, memo=memo, waived=waived, easy=easy
        )
        more = _saturated_waiters(decisions) - waived  # rule 8b
        if not more:
            return Schedule(decisions, working)
        waived |= more


def _one_pass(
    snapshot: ClusterSnapshot,
    order: list[PendingJob],
    *,
    limit: int,
    active: tuple[SharedShape, ...],
    memo: _Memo,
    waived: frozenset[str],
    easy: ShadowClock | None = None,
) -> tuple[tuple[Admit | Wait, ...], ClusterSnapshot]:
    """Rules 1-9 over the ordered queue; `waived`: keys rule 8b lets spread this pass."""
    working = snapshot
    blocked: list[_Blocked] = []
    decisions: list[Admit | Wait | _Blocked] = []

    for job in order:
        protected = [b for b in blocked if b.skipped >= limit]
        held = frozenset[str]().union(*(b.usable for b in protected))
        result = memo.place(memo.without(working, held), job.request, active)
        # The held room rule 9 lets this gang use, and its place with it.
        result, opened = (
            _try_held_room(
                easy,
                memo,
                working=working,
                protected=protected,
                held=held,
                job=job,
                outside=result,
                active=active,
            )
            if held and easy is not None
            else (result, frozenset[str]())
        )
        closed = held - opened
        if closed and isinstance(result, Placement) and result.preferred_met is False:
            # Spread only because the room it prefers is held for an earlier gang: wait
            # for it rather than start scattered (rule 7).
            alone = memo.place(working, job.request, active)
            if isinstance(alone, Placement) and alone.preferred_met:
                first = protected[0]
                reason = explain.waiting_for(first.job.key, first.skipped, len(closed))
                result = Unschedulable(job.key, Blocker.HELD, reason)
        if (
            not job.may_spread
            and job.skipped < limit  # rule 8a: a protected gang does not wait by choice
            and job.key not in waived  # rule 8b
            and isinstance(result, Placement)
            and result.preferred_room is not None  # missed the preferred level, not by spread
            and memo.fits_one_preferred_domain(job.request)
        ):
            reason = explain.waiting_for_preferred_level(result.preferred_room.describe(now=True))
            decisions.append(Wait(job, WAITING_FOR_PREFERRED_LEVEL, reason, job.skipped))
            continue
        if isinstance(result, Placement | SharedPlacement):
            # Held room rule 9 opened is free again before any gang held back could use it.
            used = set(result.nodes) - opened
            for waiting in blocked:
                if waiting.skipped < limit and used & waiting.usable:
                    waiting.skipped += 1
            working = _with(working, job.request, result)
            if easy is not None and job.max_run is not None and isinstance(result, Placement):
                easy.admitted(job.request.needs, result.nodes, job.max_run)
            decisions.append(Admit(job, result, bool(blocked), bool(opened & set(result.nodes))))
            continue

        code, reason = str(result.code), result.reason
        if held:
            alone = memo.place(working, job.request, active)
            if isinstance(alone, Placement | SharedPlacement):
                code = HELD_FOR_EARLIER_JOB
                reason = _held_reason(easy, working, protected, job, len(held))
            else:
                code, reason = str(alone.code), alone.reason
        never = memo.never(job.request)
        if never is not None:
            if never.code == LARGER_THAN_ANY_GPU:
                code, reason = never.code, never.reason  # the job fails on this code
            elif never.code != Blocker.INVALID_REQUEST:
                code, reason = NEVER_FITS, explain.never_fits(never.reason)
            decisions.append(Wait(job, code, reason, job.skipped))
            continue
        entry = _Blocked(job, memo.usable(job.request), job.skipped, code, reason)
        blocked.append(entry)
        decisions.append(entry)

    final = tuple(
        Wait(d.job, d.code, d.reason, d.skipped) if isinstance(d, _Blocked) else d
        for d in decisions
    )
    return final, working


def _try_held_room(
    easy: ShadowClock,
    memo: _Memo,
    *,
    working: ClusterSnapshot,
    protected: list[_Blocked],
    held: frozenset[str],
    job: PendingJob,
    outside: _Result,
    active: tuple[SharedShape, ...],
) -> tuple[_Result, frozenset[str]]:
    """Rule 9: the gang's place with the held room it may use opened, and that room; or
    `outside` and nothing when it has no bound, fits well outside the held room, nothing
    opens, or it would start no better than `outside`."""
    nothing = frozenset[str]()
    if job.max_run is None or not _wants_room(outside):
        return outside, nothing
    waiting = [HeldRoom(b.job.key, b.job.request, b.usable) for b in protected]
    still = easy.still_held(working, waiting, job.max_run)
    if still == held:
        return outside, nothing
    trial = memo.place(memo.without(working, still), job.request, active)
    if not _placed(trial) or (_placed(outside) and getattr(trial, "preferred_met", None) is False):
        return outside, nothing  # spread either way: keep the held room for its gang
    return trial, held - still


def _held_reason(
    easy: ShadowClock | None,
    working: ClusterSnapshot,
    protected: list[_Blocked],
    job: PendingJob,
    nodes: int,
) -> str:
    """Why a gang that fits the held room waits; for a gang with a run bound, also why
    rule 9 did not let it in, and for one without, whether a bound could have. No figure
    that changes from round to round: the reason is written to the job's status when it
    changes."""
    first = protected[0]
    reason = explain.waiting_for(first.job.key, first.skipped, nodes)
    if easy is None:
        return reason
    room = HeldRoom(first.job.key, first.job.request, first.usable)
    shadow_known = easy.shadow(working, room) is not None
    if job.max_run is None:
        return reason + explain.no_bound_stated(shadow_known)
    return reason + explain.bound_too_long(job.max_run, shadow_known)


def _fits(snapshot: ClusterSnapshot, request: GangRequest, active: tuple[SharedShape, ...]) -> bool:
    return _placed(_place(snapshot, request, active))


def _placed(result: _Result) -> bool:
    return isinstance(result, Placement | SharedPlacement)


def _wants_room(result: _Result) -> bool:
    """Rule 9 is tried for a gang that does not fit outside the held room, or fits there
    only spread over domains of its preferred level."""
    return not _placed(result) or getattr(result, "preferred_met", None) is False


# Waits no room can end: they say nothing about whether the cluster is saturated.
_NOT_WAITING_FOR_ROOM = frozenset({NEVER_FITS, LARGER_THAN_ANY_GPU, str(Blocker.INVALID_REQUEST)})


def _saturated_waiters(decisions: tuple[Admit | Wait, ...]) -> frozenset[str]:
    """Rule 8b: the gangs waiting for their preferred level behind which (later in queue
    order) some gang still waits for room."""
    found: set[str] = set()
    behind = False  # a later gang waits for room
    for decision in reversed(decisions):
        if not isinstance(decision, Wait):
            continue
        if decision.code == WAITING_FOR_PREFERRED_LEVEL and behind:
            found.add(decision.job.key)
        if decision.code not in _NOT_WAITING_FOR_ROOM:
            behind = True
    return frozenset(found)


_Shape = tuple[object, ...]
_Result = Placement | SharedPlacement | Unschedulable | SharedRefusal


def _place(
    snapshot: ClusterSnapshot, request: GangRequest, active: tuple[SharedShape, ...]
) -> Placement | SharedPlacement | Unschedulable | SharedRefusal:
    if request.shared_mib is None:
        return place(snapshot, request)
    return place_shared_gang(snapshot, request, active)


def _with(
    snapshot: ClusterSnapshot, request: GangRequest, result: Placement | SharedPlacement
) -> ClusterSnapshot:
    """The snapshot with the admitted gang's workers counted where they go."""
    if isinstance(result, SharedPlacement):
        return snapshot.with_workers(request.needs, result.workers_by_node(), result.gpu_mib())
    return snapshot.with_workers(request.needs, result.workers_by_node())


class _Memo:
    """Answers that stay the same for a whole round, computed once per request shape.

    Queues hold many gangs of one shape (sweeps, retries), and with 1,000 nodes every
    snapshot rebuild or placement costs about a millisecond.
    """

    def __init__(self, snapshot: ClusterSnapshot):
        self.snapshot = snapshot
        self._empty: ClusterSnapshot | None = None
        self._never: dict[_Shape, Unschedulable | SharedRefusal | None] = {}
        self._usable: dict[_Shape, frozenset[str]] = {}
        self._one_domain: dict[_Shape, bool] = {}
        self._open: tuple[ClusterSnapshot, frozenset[str], ClusterSnapshot] | None = None
        self._placed: dict[_Shape, tuple[ClusterSnapshot, _Result]] = {}

    def place(
        self, snapshot: ClusterSnapshot, request: GangRequest, active: tuple[SharedShape, ...]
    ) -> _Result:
        """`_place`, remembered per request shape while the snapshot is the same object: a
        queue of many gangs of one shape that wait (or the same queue decided again, rule
        8b) asks once per working snapshot, not once per gang. The answer is given back
        under the asking gang's name. `active` is the same for a whole round."""
        shape = (*_shape(request), request.preferred_level)
        known = self._placed.get(shape)
        if known is not None and known[0] is snapshot:
            result = known[1]
            return (
                result if isinstance(result, SharedRefusal) else replace(result, job=request.name)
            )
        result = _place(snapshot, request, active)
        self._placed[shape] = (snapshot, result)
        return result

    def never(self, request: GangRequest) -> Unschedulable | SharedRefusal | None:
        """Why the request cannot fit even the empty cluster; None when it can."""
        shape = _shape(request)
        if shape not in self._never:
            self._empty = self._empty or self.snapshot.emptied()
            result = _place(self._empty, request, ())
            never = isinstance(result, Unschedulable | SharedRefusal)
            self._never[shape] = result if never else None  # type: ignore[assignment]
        return self._never[shape]

    def fits_one_preferred_domain(self, request: GangRequest) -> bool:
        """Whether the gang fits one domain of its preferred level in the empty cluster."""
        shape = (*_shape(request), request.preferred_level)
        if shape not in self._one_domain:
            self._empty = self._empty or self.snapshot.emptied()
            alone = replace(request, required_level=request.preferred_level)
            self._one_domain[shape] = isinstance(place(self._empty, alone), Placement)
        return self._one_domain[shape]

    def usable(self, request: GangRequest) -> frozenset[str]:
        """Nodes that could ever take one of the request's workers."""
        shape = (request.needs, *sorted(request.node_selector.items()))
        if shape not in self._usable:
            self._empty = self._empty or self.snapshot.emptied()
            matching = self.snapshot.matching(request.node_selector)
            slots = self._empty.slots(request.needs)
            self._usable[shape] = frozenset(
                node.name
                for node, ok, room in zip(self.snapshot.nodes, matching, slots, strict=True)
                if ok and room > 0
            )
        return self._usable[shape]

    def without(self, working: ClusterSnapshot, held: frozenset[str]) -> ClusterSnapshot:
        """`working` with the held nodes closed, rebuilt only when either changed."""
        if not held:
            return working
        if self._open is None or self._open[0] is not working or self._open[1] != held:
            names = (name for name in working.topology.node_names if name not in held)
            self._open = (working, held, working.restricted(names))
        return self._open[2]


def _shape(request: GangRequest) -> _Shape:
    """What decides whether a request can fit: everything but its name and preference."""
    return (
        request.workers,
        request.gpus_per_worker,
        request.required_level,
        request.parallelism,
        request.needs,
        request.shared_mib,
        *sorted(request.node_selector.items()),
    )
