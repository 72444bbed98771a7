"""Sentences for every "no" the placement engine and its queue give. Pure.

Each message goes to a person reading `kubectl describe tj`: it says what the job needs and
what the cluster has, in numbers, so they can tell "wait" from "change the job".
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainwave.placement.snapshot import Selector


def plural(count: int, noun: str, many: str | None = None) -> str:
    return f"{count} {noun if count == 1 else many or noun + 's'}"


def gang(workers: int, gpus_per_worker: int) -> str:
    """'32 GPUs (4 workers x 8)'."""
    total = workers * gpus_per_worker
    if gpus_per_worker == 0:
        return f"{plural(workers, 'worker')} (no GPUs)"
    if workers == 1:
        return f"{plural(total, 'GPU')} (1 worker)"
    return f"{total} GPUs ({workers} workers x {gpus_per_worker})"


def scope(selector: Selector) -> str:
    """' matching gpu.product=H200' for a job with a node selector, else ''."""
    if not selector:
        return ""
    terms = ", ".join(
        f"{key.rsplit('/', 1)[-1]}={_alternatives(value)}"
        for key, value in sorted(selector.items())
    )
    return f" matching {terms}"


def _alternatives(value: str | frozenset[str]) -> str:
    return "|".join(sorted(value)) if isinstance(value, frozenset) else value


def unknown_level(which: str, level: str, levels: str) -> str:
    return f"{which} level {level!r} is not a topology level; the levels are: {levels}"


def no_matching_nodes(selector: Selector, nodes: str = "") -> str:
    """No node passes the filters that waiting cannot change; `nodes` says why, per node."""
    if nodes:
        return f"no node{scope(selector)} can take a worker: {nodes}"
    return f"no schedulable node with GPUs{scope(selector)}"


def worker_too_large(gpus_per_worker: int, largest: int, selector: Selector) -> str:
    return (
        f"each worker needs {plural(gpus_per_worker, 'GPU')}, "
        f"but the largest node{scope(selector)} has {largest}"
    )


def not_enough_gpus(
    workers: int, gpus_per_worker: int, room: int, free: int, selector: Selector
) -> str:
    pieces = "" if free <= room * gpus_per_worker else f", some in pieces under {gpus_per_worker}"
    return (
        f"needs {gang(workers, gpus_per_worker)}; the free GPUs{scope(selector)} have room "
        f"for {plural(room, 'such worker')} ({free} GPUs free{pieces})"
    )


def not_enough_room(
    workers: int,
    gpus_per_worker: int,
    room: int,
    free: int | None,
    selector: Selector,
    *,
    nodes: str,
) -> str:
    """Too few slots; `free` GPUs when GPUs are what is short (None otherwise); `nodes` is
    the per-node breakdown (filters.describe)."""
    if free is None:
        head = (
            f"needs {gang(workers, gpus_per_worker)}; the nodes{scope(selector)} have room "
            f"for {plural(room, 'such worker')}"
        )
    else:
        head = not_enough_gpus(workers, gpus_per_worker, room, free, selector)
    return f"{head}; {nodes}" if nodes else head


def tensor_groups_do_not_fit(
    tensor: int, group_workers: int, domain: str, have: int, need: int
) -> str:
    return (
        f"each tensor-parallel group of {tensor} GPUs ({plural(group_workers, 'worker')}) "
        f"must sit in one {domain}; the free ones hold {plural(have, 'such group')}, "
        f"{need} needed"
    )


def replicas_do_not_fit(
    *, tensor: int, pipeline: int, replica_workers: int, domain: str, have: int, need: int
) -> str:
    return (
        f"each model replica ({plural(pipeline, 'pipeline stage')} x {tensor} GPUs, "
        f"{plural(replica_workers, 'worker')}) must sit in one {domain}; the free ones hold "
        f"{plural(have, 'such replica')}, {need} needed"
    )


def required_domain_too_small(
    *, level: str, workers: int, gpus_per_worker: int, roomiest: str, room: int, free: int
) -> str:
    return (
        f"needs {gang(workers, gpus_per_worker)} within one {level}; the roomiest {level}, "
        f"{roomiest}, has room for {plural(room, 'such worker')} ({free} GPUs free)"
    )


def never_fits(reason: str) -> str:
    return f"cannot fit even on an empty cluster: {reason}"


def waiting_for_preferred_level(why: str) -> str:
    """A gang that would start spread out, waiting a bounded time for one domain instead."""
    return (
        f"{why}, though one could hold the gang: waiting for one "
        "(up to spec.placement.preferredLevelWaitSeconds) before starting spread out"
    )


def waiting_for(key: str, skipped: int, nodes: int) -> str:
    """A gang held back because an earlier one has used up its backfill allowance."""
    return (
        f"waiting for {key}, which later jobs have overtaken {plural(skipped, 'time')}: "
        f"until it starts, nothing else may start on the {plural(nodes, 'node')} it can use"
    )


def bound_too_long(max_run: float, shadow_known: bool) -> str:
    """Why a gang with runPolicy.maxRunSeconds may not start on held room (queue rule 9)."""
    if not shadow_known:
        return (
            "; its runPolicy.maxRunSeconds cannot help: that room is complete only once "
            "gangs that state none have ended"
        )
    return (
        f"; its runPolicy.maxRunSeconds ({max_run:.0f}s) would not end before that room is complete"
    )


def no_bound_stated(shadow_known: bool) -> str:
    """What a gang without runPolicy.maxRunSeconds could gain from one (queue rule 9):
    nothing while the held room waits on gangs that state no bound either."""
    if not shadow_known:
        return ""
    return (
        "; a job that states runPolicy.maxRunSeconds may start on that room when it would "
        "end before the room is complete"
    )
