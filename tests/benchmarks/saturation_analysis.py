"""What a saturation run measured, from the times the benchmark's own watch saw. Pure.

Input: every worker pod's span on its node (released by the operator, bound, Running,
ended) and every gang's arrival, all in seconds after the stream started. Output:

- hand-off lag: for a gang that had to wait for room, its start (last worker Running)
  minus the moment its room appeared: on each of its nodes, the moment the other pods
  there last left it enough free GPUs for this gang's workers (the end of the last pod
  whose leaving made room), the latest of those over its nodes. A gang whose room was
  already there when it arrived is a "found room at once" sample instead (start minus
  arrival), as the issue compares them. The lag is split into its stages: room -> the
  operator released the gang (pinned and ungated) -> kube-scheduler bound every worker ->
  kwok reported every worker Running.
  Hand-off lag, room not reserved (added with issue 27's fairness work; the column above is
  kept as it was): a gang the queue held because its room was reserved for an earlier,
  protected gang (HeldForEarlierJob) had no room of its own until that gang was placed.
  Its room counts from the later of the moment it appeared and the release of the last
  gang it was held for (that gang's first worker released: the round that placed it ended
  the hold). The idle GPUs of such a hold are not lost from the report: they are the gap
  between utilisation and the packable bound.
- GPU utilisation while gangs wait (any arrived gang not started): GPUs with a Running
  worker over the cluster's GPUs, and against two bounds on what any placer could have
  kept busy at each moment with the gangs that waited then: "fluid" (every waiting GPU
  fits anywhere: min(capacity, busy + waiting)) and "packable" (whole gangs only: busy
  plus the largest sum of waiting gangs that fits the free GPUs, a subset sum).
- makespan (stream start -> last worker ended) against the fluid lower bound (all work
  over the capacity, or the latest arrival + run time) and a zero-lag greedy packing
  (nodes interchangeable, each event starts every waiting gang that fits, in order).
- wait (start - arrival) by gang size.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from benchmarks.summaries import percentile

INF = float("inf")


@dataclass(frozen=True)
class PodSpan:
    gang: str
    node: str
    gpus: int
    released: float | None  # the operator pinned and ungated it (or created it pinned)
    bound: float | None  # spec.nodeName seen
    running: float | None
    ended: float | None

    @property
    def held_from(self) -> float | None:
        """From when it holds its GPUs: the earlier of its release and its binding."""
        times = [t for t in (self.released, self.bound) if t is not None]
        return min(times) if times else None


@dataclass(frozen=True)
class GangSpan:
    name: str
    workers: int
    gpus: int
    arrival: float
    run_seconds: float
    pods: tuple[PodSpan, ...]

    @property
    def complete(self) -> bool:
        return len(self.pods) == self.workers and all(p.running is not None for p in self.pods)

    @property
    def start(self) -> float | None:
        return max(p.running for p in self.pods) if self.complete else None  # type: ignore[type-var]

    def stage(self, field: str) -> float | None:
        values = [getattr(p, field) for p in self.pods]
        return max(values) if values and None not in values else None


def room_appeared(gang: GangSpan, by_node: dict[str, list[PodSpan]], node_gpus: int) -> float:
    """When the room this gang started in appeared: -inf when it was always there."""
    start = gang.start
    assert start is not None
    need: dict[str, int] = defaultdict(int)
    for pod in gang.pods:
        need[pod.node] += pod.gpus
    room = -INF
    for node, gpus in need.items():
        changes: list[tuple[float, int]] = []
        for other in by_node.get(node, []):
            if other.gang == gang.name or other.held_from is None or other.held_from >= start:
                continue
            changes.append((other.held_from, -other.gpus))
            if other.ended is not None and other.ended < start:
                changes.append((other.ended, other.gpus))
        free, since = node_gpus, -INF
        for when, delta in sorted(changes):
            free += delta
            if free < gpus:
                since = INF  # no room (yet)
            elif since == INF:
                since = when
        room = max(room, since if since != INF else start)
    return room


def summarize_gangs(
    gangs: Sequence[GangSpan],
    node_gpus: int,
    held: Mapping[str, Sequence[tuple[float, str]]] | None = None,
    holders: Mapping[str, Iterable[str]] | None = None,
) -> dict[str, object]:
    """`held`: per gang, (time, reason) its status showed a hold by queue policy; a
    hand-off of a gang held after its room appeared counts apart (the room was kept
    for another gang, or the gang chose to wait for its preferred level). `holders`: per
    gang, the gangs its HeldForEarlierJob reasons named (for the room-not-reserved lag)."""
    held = held or {}
    holders = holders or {}
    by_node: dict[str, list[PodSpan]] = defaultdict(list)
    released: dict[str, float] = {}
    for gang in gangs:
        for pod in gang.pods:
            by_node[pod.node].append(pod)
        times = [t for t in (p.held_from for p in gang.pods) if t is not None]
        if times:
            released[gang.name] = min(times)
    handoff: list[float] = []
    unreserved: list[float] = []
    unheld: list[float] = []
    policy: dict[str, list[float]] = defaultdict(list)
    at_once: list[float] = []
    stages: dict[str, list[float]] = {"released": [], "bound": [], "running": []}
    samples: list[tuple[str, float, float, float]] = []
    for gang in gangs:
        start = gang.start
        if start is None:
            continue
        room = room_appeared(gang, by_node, node_gpus)
        if room > gang.arrival:
            handoff.append(start - room)
            ends = [
                released[h] for h in holders.get(gang.name, ()) if released.get(h, INF) <= start
            ]
            unreserved.append(start - max([room, *ends]))
            reasons = holds_between(held.get(gang.name, ()), room, start)
            if reasons:
                for reason in reasons:
                    policy[reason].append(start - room)
            else:
                unheld.append(start - room)
            samples.append((gang.name, round(room, 2), round(start, 2), round(start - room, 2)))
            previous = room
            for stage in ("released", "bound", "running"):
                reached = gang.stage(stage)
                if reached is not None:
                    stages[stage].append(max(0.0, reached - previous))
                    previous = max(previous, reached)
        else:
            at_once.append(start - gang.arrival)
    return {
        "handoff_lag_seconds": quantiles(handoff),
        "handoff_lag_room_not_reserved_seconds": quantiles(unreserved),
        "handoff_lag_not_held_seconds": quantiles(unheld),
        "handoff_lag_held_by_policy_seconds": {r: quantiles(v) for r, v in policy.items()},
        "handoff_stages_seconds": {
            "room_to_released (operator)": quantiles(stages["released"]),
            "released_to_bound (kube-scheduler)": quantiles(stages["bound"]),
            "bound_to_running (kwok)": quantiles(stages["running"]),
        },
        "found_room_at_once_start_seconds": quantiles(at_once),
        "slowest_handoffs": sorted(samples, key=lambda s: -s[3])[:8],
    }


HOLDS = ("HeldForEarlierJob", "WaitingForPreferredLevel")


def holds_between(changes: Sequence[tuple[float, str]], since: float, until: float) -> set[str]:
    """The hold reasons in effect at any moment of [since, until], from a gang's Scheduled
    reason changes (time, reason) in time order."""
    found, current = set(), ""
    for when, reason in changes:
        if when > until:
            break
        if when > since and current in HOLDS:
            found.add(current)
        current = reason
    if current in HOLDS:
        found.add(current)
    return found


def quantiles(values: Iterable[float]) -> dict[str, float]:
    ordered = sorted(values)
    if not ordered:
        return {"count": 0}
    return {
        "count": len(ordered),
        "p50": round(percentile(ordered, 0.5), 2),
        "p95": round(percentile(ordered, 0.95), 2),
        "p99": round(percentile(ordered, 0.99), 2),
        "max": round(ordered[-1], 2),
    }


def waits_by_size(gangs: Sequence[GangSpan]) -> dict[str, dict[str, float]]:
    waits: dict[int, list[float]] = defaultdict(list)
    unstarted: dict[int, int] = defaultdict(int)
    for gang in gangs:
        start = gang.start
        if start is None:
            unstarted[gang.workers] += 1
        else:
            waits[gang.workers].append(start - gang.arrival)
    return {
        f"{size} nodes": quantiles(waits[size]) | {"never_started": unstarted[size]}
        for size in sorted(set(waits) | set(unstarted))
    }


def utilisation(gangs: Sequence[GangSpan], capacity: int) -> dict[str, float | None]:
    """GPU use while any gang waits, against the fluid and packable bounds (see top)."""
    events: list[tuple[float, int, str, int]] = []  # (time, order, gang, delta)
    for gang in gangs:
        events.append((gang.arrival, 0, gang.name, gang.gpus))  # waiting demand appears
        for pod in gang.pods:
            if pod.running is not None:
                events.append((pod.running, 1, gang.name, -pod.gpus))  # waiting -> busy
                if pod.ended is not None:
                    events.append((pod.ended, 2, gang.name, -pod.gpus))  # busy -> free
    events.sort()
    waiting: dict[str, int] = {}
    busy = 0
    area = {"busy": 0.0, "capacity": 0.0, "fluid": 0.0, "packable": 0.0, "all_busy": 0.0}
    last = events[0][0] if events else 0.0
    for when, order, name, delta in events:
        span = when - last
        if span > 0:
            area["all_busy"] += busy * span
            if waiting:
                area["busy"] += busy * span
                area["capacity"] += capacity * span
                area["fluid"] += min(capacity, busy + sum(waiting.values())) * span
                area["packable"] += (busy + subset_sum(waiting.values(), capacity - busy)) * span
            last = when
        if order == 0:
            waiting[name] = delta
        elif order == 1:
            busy -= delta
            left = waiting.get(name, 0) + delta
            if left > 0:
                waiting[name] = left
            else:
                waiting.pop(name, None)
        else:
            busy += delta

    def ratio(a: float, b: float) -> float | None:
        return round(a / b, 3) if b else None

    return {
        "seconds_with_gangs_waiting": round(area["capacity"] / capacity, 1) if capacity else 0,
        "utilisation_while_waiting": ratio(area["busy"], area["capacity"]),
        "of_fluid_bound": ratio(area["busy"], area["fluid"]),
        "of_packable_bound": ratio(area["busy"], area["packable"]),
        "gpu_seconds_busy": round(area["all_busy"], 1),
    }


def subset_sum(sizes: Iterable[int], limit: int) -> int:
    """The largest sum of some of `sizes` that is at most `limit` (a bitset of sums)."""
    if limit <= 0:
        return 0
    mask = (1 << (limit + 1)) - 1
    reachable = 1
    for size in sizes:
        if 0 < size <= limit:
            reachable = (reachable | (reachable << size)) & mask
    return reachable.bit_length() - 1


def greedy_makespan(jobs: Sequence[tuple[float, int, float]], nodes: int) -> float:
    """Zero-lag packing of (arrival, nodes, run seconds) on interchangeable nodes: at each
    arrival or end, every waiting job that fits starts, in arrival order."""
    pending = sorted(jobs)
    queue: list[tuple[float, int, float]] = []
    ends: list[tuple[float, int]] = []
    free, now, index, finish = nodes, 0.0, 0, 0.0
    while index < len(pending) or queue or ends:
        next_arrival = pending[index][0] if index < len(pending) else INF
        now = min(next_arrival, ends[0][0] if ends else INF)
        while ends and ends[0][0] <= now:
            free += heapq.heappop(ends)[1]
        while index < len(pending) and pending[index][0] <= now:
            queue.append(pending[index])
            index += 1
        still = []
        for arrival, size, run in queue:
            if size <= free:
                free -= size
                heapq.heappush(ends, (now + run, size))
                finish = max(finish, now + run)
            else:
                still.append((arrival, size, run))
        queue = still
        if not ends and index >= len(pending) and queue:
            raise ValueError(f"a job of {queue[0][1]} nodes never fits {nodes} nodes")
    return finish


def makespan(gangs: Sequence[GangSpan], capacity: int, nodes: int) -> dict[str, float | None]:
    ends = [p.ended for g in gangs for p in g.pods]
    measured = max(e for e in ends if e is not None) if ends and None not in ends else None
    work = sum(g.gpus * g.run_seconds for g in gangs)
    fluid = max(work / capacity, max((g.arrival + g.run_seconds for g in gangs), default=0))
    greedy = greedy_makespan([(g.arrival, g.workers, g.run_seconds) for g in gangs], nodes)
    return {
        "measured_seconds": round(measured, 1) if measured is not None else None,
        "fluid_bound_seconds": round(fluid, 1),
        "zero_lag_greedy_seconds": round(greedy, 1),
        "over_fluid": round(measured / fluid, 3) if measured else None,
        "over_zero_lag_greedy": round(measured / greedy, 3) if measured else None,
    }
