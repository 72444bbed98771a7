"""The fault benchmark's report: one table per fault kind, in-place beside recreation."""

from __future__ import annotations

from typing import Any


def _number(value: Any, unit: str = "") -> str:
    if value is None:
        return "—"
    return f"{value:.1f}{unit}" if isinstance(value, float) else f"{value}{unit}"


def goals(result: dict[str, Any]) -> list[str]:
    """The issue's goals, each with what this run measured."""
    runs = {run["mode"]: run for run in result["runs"]}
    lines = []
    in_place, recreate = runs.get("in-place"), runs.get("recreate")
    hang = result["conditions"]["hang_timeout_seconds"]
    if in_place and recreate:
        kill = [
            next((f for f in run["faults"] if f["kind"] == "kill"), None)
            for run in (in_place, recreate)
        ]
        if all(f and f.get("recovery_seconds") for f in kill):
            ratio = kill[1]["recovery_seconds"] / kill[0]["recovery_seconds"]
            verdict = "met" if ratio >= 5 else "NOT met"
            lines.append(f"- first new step after a process kill at least 5x sooner than "
                         f"recreation: {ratio:.1f}x ({verdict})")  # fmt: skip
        if recreate["goodput"]:
            ratio = in_place["goodput"] / recreate["goodput"]
            verdict = "met" if ratio >= 1.5 else "NOT met"
            lines.append(f"- goodput of the whole run at least 1.5x recreation's: "
                         f"{ratio:.2f}x ({verdict})")  # fmt: skip
            ceiling = instant_repair_goodput(in_place, hang)
            if ceiling is not None:
                lines.append(
                    f"  - derived, not measured: were every in-place repair instant (a hang still "
                    f"costing its hangTimeoutSeconds, the slowed rank and the start as measured), "
                    f"in-place goodput would be {ceiling:.3f}, {ceiling / recreate['goodput']:.2f}x "
                    f"recreation's: the most this schedule allows against this baseline"
                )
    for run in result["runs"]:
        for fault in run["faults"]:
            if fault["kind"] == "stop":
                seconds = fault.get("detect_seconds")
                verdict = "met" if seconds is not None and seconds <= hang + 10 else "NOT met"
                lines.append(f"- {run['mode']}: SIGSTOPped rank detected within "
                             f"hangTimeoutSeconds + 10 s = {hang + 10} s: "
                             f"{_number(seconds, ' s')} ({verdict})")  # fmt: skip
            if fault["kind"] == "slow":
                reports = fault.get("reports_to_detect")
                verdict = "met" if reports is not None and reports <= 10 else "NOT met"
                lines.append(f"- {run['mode']}: rank slowed 2x named within 10 reports: "
                             f"{_number(reports)} ({verdict})")  # fmt: skip
    return lines


def instant_repair_goodput(run: dict[str, Any], hang_timeout: float) -> float | None:
    """The run's goodput had each repair cost nothing beyond what the schedule forces on
    any mode (a stopped rank is found only after hangTimeoutSeconds): the repair time and
    the steps lost to it taken out of the wall time; None when a fault lacks a figure."""
    productive = run["goodput"] * run["wall_seconds"]
    saved = 0.0
    for fault in run["faults"]:
        if fault["kind"] == "slow":
            continue  # nothing to repair: the rank runs on, slower
        if fault.get("recovery_seconds") is None or fault.get("steps_lost") is None:
            return None
        forced = hang_timeout if fault["kind"] == "stop" else 0.0
        saved += max(0.0, fault["recovery_seconds"] - forced)
        saved += fault["steps_lost"] * run["healthy_step_seconds"]
    return productive / (run["wall_seconds"] - saved)


def victim(kind: str, rank: int, processes_per_worker: int) -> str:
    """Whom a fault hit: a drain takes a whole worker (its pod), the others one rank."""
    if kind == "drain":
        return f"worker {rank // processes_per_worker}"
    return f"rank {rank}"


def whom(fault: dict[str, Any], processes_per_worker: int) -> str:
    """`victim`, and for a drain the node it left and the node its new pod ran on."""
    named = victim(fault["kind"], fault["rank"], processes_per_worker)
    if fault.get("node"):
        cordoned = "cordoned " if fault.get("cordoned") else ""
        named += f" (off {cordoned}{fault['node']}, to {fault.get('moved_to') or '?'})"
    return named


def render_markdown(result: dict[str, Any]) -> str:
    conditions = result["conditions"]
    per_worker = conditions["processes_per_worker"]
    out = [
        "# Faults: in-place repair against gang recreation (bench_faults.py)",
        "",
        f"Commit {result['commit']}, seed {result['seed']}, schedule "
        + ", ".join(f"{kind} {victim(kind, rank, per_worker)}" for kind, rank in result["schedule"])
        + ".",
        "",
        "Conditions: " + "; ".join(f"{k} {v}" for k, v in conditions.items()) + ".",
        "",
        "| mode | fault | whom | detect (s) | fault to first new step (s) | steps lost |",
        "|---|---|---|---|---|---|",
    ]
    for run in result["runs"]:
        for fault in run["faults"]:
            out.append(
                f"| {run['mode']} | {fault['kind']} | {whom(fault, per_worker)} "
                f"| {_number(fault.get('detect_seconds'))} "
                f"| {_number(fault.get('recovery_seconds'))} "
                f"| {_number(fault.get('steps_lost'))} |"
            )
    out += ["", "| mode | phase | goodput (measured) | wall (s) | healthy step (s) | status.goodput |",
            "|---|---|---|---|---|---|"]  # fmt: skip
    for run in result["runs"]:
        reported = (run["status"].get("goodput") or {}).get("ratio")
        out.append(
            f"| {run['mode']} | {run['phase']} | {run['goodput']:.3f} "
            f"| {_number(run['wall_seconds'])} | {run['healthy_step_seconds']:.3f} "
            f"| {_number(reported)} |"
        )
    out += ["", "Goals (issue 26):", *goals(result), ""]
    return "\n".join(out)
