"""trainwave against its peer (Kueue) on one saturation stream: the same figures for both
sides, from each side's pod spans, and the side-by-side table. Pure.

Both sides go through the same functions of saturation_analysis.py (hand-off lag with its
stages, utilisation while gangs wait against the packable bound, makespan against the
bounds, waits by gang size); no side's own status is read, so nothing one side reports
about itself (holds, placement summaries) enters the comparison. Locality is read from the
nodes the workers ran on (node names carry the rack: "<prefix>-r<rack>-n<position>").
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from benchmarks.saturation_analysis import (
    GangSpan,
    PodSpan,
    makespan,
    quantiles,
    room_appeared,
    summarize_gangs,
    utilisation,
    waits_by_size,
)

RACK_OF_NODE = re.compile(r"-r(\d+)-n\d+$")


def side_figures(
    gangs: Sequence[GangSpan],
    pods: dict[str, dict[str, Any]],
    *,
    finished: bool,
    nodes: int,
    node_gpus: int,
    rack_nodes: int,
) -> dict[str, Any]:
    handoff = summarize_gangs(gangs, node_gpus)
    return {
        "all_finished": finished,
        "pods_not_succeeded": sum(
            1 for p in pods.values() if p.get("phase") not in (None, "Succeeded")
        ),
        "gangs_started": sum(1 for g in gangs if g.start is not None),
        "handoff_lag_seconds": handoff["handoff_lag_seconds"],
        "handoff_stages_seconds": handoff["handoff_stages_seconds"],
        "found_room_at_once_start_seconds": handoff["found_room_at_once_start_seconds"],
        "slowest_handoffs": handoff["slowest_handoffs"],
        "utilisation": utilisation(gangs, nodes * node_gpus),
        "makespan": makespan(gangs, nodes * node_gpus, nodes),
        "wait_seconds_by_gang_size": waits_by_size(gangs),
        "locality": racks_used(gangs, rack_nodes),
    }


def kueue_stages(
    gangs: Sequence[GangSpan], workloads: Mapping[str, Mapping[str, float]], node_gpus: int
) -> dict[str, dict[str, float]]:
    """Kueue's share of the "room -> released" stage, from its Workloads' conditions as the
    watch saw them: room -> quota reserved (the ended Job seen finished, its quota given
    back, the next Workload admitted), quota reserved -> released (the Job unsuspended, its
    pods created by the Job controller and, with TAS, ungated onto their nodes); and for
    every gang, its last worker's end -> its Workload Finished (the quota given back)."""
    by_node: dict[str, list[PodSpan]] = defaultdict(list)
    for gang in gangs:
        for pod in gang.pods:
            by_node[pod.node].append(pod)
    admit, release, give_back = [], [], []
    for gang in gangs:
        seen, start = workloads.get(gang.name, {}), gang.start
        ended = gang.stage("ended")
        if ended is not None and "finished" in seen:
            give_back.append(seen["finished"] - ended)
        if start is None or "admitted" not in seen:
            continue
        room = room_appeared(gang, by_node, node_gpus)
        released = gang.stage("released")
        if room > gang.arrival and released is not None:
            admit.append(max(0.0, seen["admitted"] - room))
            release.append(max(0.0, released - max(room, seen["admitted"])))
    return {
        "room_to_quota_reserved (Kueue)": quantiles(admit),
        "quota_reserved_to_released (Job controller, TAS ungater)": quantiles(release),
        "last_worker_ended_to_workload_finished": quantiles(give_back),
    }


def racks_used(gangs: Sequence[GangSpan], rack_nodes: int) -> dict[str, int]:
    """Of the gangs one rack could hold: started in one rack, or over several."""
    one = spread = 0
    for gang in gangs:
        if gang.workers > rack_nodes or gang.start is None:
            continue
        racks = {match.group(1) for p in gang.pods if (match := RACK_OF_NODE.search(p.node))}
        if len(racks) == 1:
            one += 1
        elif racks:
            spread += 1
    return {"one_rack": one, "spread": spread}


# (label, path into side_figures, lower is better)
ROWS: tuple[tuple[str, tuple[str, ...], bool], ...] = (
    ("hand-off lag p50, s", ("handoff_lag_seconds", "p50"), True),
    ("hand-off lag p99, s", ("handoff_lag_seconds", "p99"), True),
    ("hand-off lag max, s", ("handoff_lag_seconds", "max"), True),
    ("gangs that waited for room (n)", ("handoff_lag_seconds", "count"), True),
    (
        "stage p50: room -> released (queue)",
        ("handoff_stages_seconds", "room_to_released (operator)", "p50"),
        True,
    ),
    (
        "stage p50: released -> bound (kube-scheduler)",
        ("handoff_stages_seconds", "released_to_bound (kube-scheduler)", "p50"),
        True,
    ),
    (
        "stage p50: bound -> Running (kwok)",
        ("handoff_stages_seconds", "bound_to_running (kwok)", "p50"),
        True,
    ),
    (
        "found room at once: arrival -> Running p50, s",
        ("found_room_at_once_start_seconds", "p50"),
        True,
    ),
    ("GPU use while gangs wait", ("utilisation", "utilisation_while_waiting"), False),
    ("  of the packable bound", ("utilisation", "of_packable_bound"), False),
    ("makespan, s", ("makespan", "measured_seconds"), True),
    ("  x fluid bound", ("makespan", "over_fluid"), True),
    ("  x zero-lag greedy packing", ("makespan", "over_zero_lag_greedy"), True),
)


def dig(figures: dict[str, Any], path: Sequence[str]) -> Any:
    value: Any = figures
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return value


def verdict(ours: Any, theirs: Any, lower_is_better: bool) -> str:
    if not isinstance(ours, int | float) or not isinstance(theirs, int | float):
        return ""
    if ours == theirs:
        return "same"
    return "trainwave" if (ours < theirs) == lower_is_better else "Kueue"


def comparison_rows(
    ours: dict[str, Any], theirs: dict[str, Any]
) -> list[tuple[str, Any, Any, str]]:
    rows = []
    for label, path, lower in ROWS:
        a, b = dig(ours, path), dig(theirs, path)
        rows.append((label, a, b, "" if path[-1] == "count" else verdict(a, b, lower)))
    sizes = sorted(
        set(ours["wait_seconds_by_gang_size"]) | set(theirs["wait_seconds_by_gang_size"]),
        key=lambda size: int(size.split()[0]),
    )
    for size in sizes:
        a = dig(ours, ("wait_seconds_by_gang_size", size, "p95"))
        b = dig(theirs, ("wait_seconds_by_gang_size", size, "p95"))
        rows.append((f"wait p95, {size} gangs, s", a, b, verdict(a, b, True)))
    rows.append(("gangs one rack could hold: in one rack / spread", racks_text(ours),
                 racks_text(theirs), ""))  # fmt: skip
    rows.append(("all finished; pods not Succeeded",
                 f"{ours['all_finished']}; {ours['pods_not_succeeded']}",
                 f"{theirs['all_finished']}; {theirs['pods_not_succeeded']}", ""))  # fmt: skip
    return rows


def racks_text(figures: dict[str, Any]) -> str:
    return f"{figures['locality']['one_rack']} / {figures['locality']['spread']}"


def comparison_table(ours: dict[str, Any], theirs: dict[str, Any]) -> str:
    lines = ["| figure | trainwave | Kueue | better |", "|---|---|---|---|"]
    lines += [
        f"| {label} | {a} | {b} | {who} |" for label, a, b, who in comparison_rows(ours, theirs)
    ]
    return "\n".join(lines)
