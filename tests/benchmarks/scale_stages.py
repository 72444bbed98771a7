"""Where a scale run's per-job time went: the operator's part and what came after it.

bench_scale.py reports each job's creation and all-Running (`job_timeline`, seconds after the
apply started); the operator's log says when it placed the gang ("placed at creation") and
when the job turned Starting/Scheduling (workers bound) and Running. Joined per job:
created -> placed is the operator's share; placed -> all Running is kube-scheduler's binding
and kwok marking the pods Running. Log lines carry wall-clock time and the timeline offsets,
so the apply's start is recovered from the jobs' Running lines (median). A log appended to by
several runs is cut to one with --since/--until (HH:MM:SS, the log's clock).

Usage: scale_stages.py RESULT.json OPERATOR.log [--since 02:48:00] [--until 03:00:00]
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
from datetime import datetime
from pathlib import Path
from typing import Any

LINE = re.compile(r"^(\S+ (\S+)) INFO \S+ [^/\s]+/(\S+?): (.*)$")


def quantiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    if not ordered:
        return {}
    return {
        "n": len(ordered),
        "p50": round(statistics.median(ordered), 1),
        "p99": round(ordered[math.ceil(0.99 * len(ordered)) - 1], 1),  # nearest rank
        "max": round(ordered[-1], 1),
    }


def stages(result: dict, log: Path, since: str, until: str) -> dict[str, Any]:
    """Quantiles of each stage over the jobs the log shows, and the five slowest jobs' stages;
    {} when the log shows no job of the run Running."""
    timeline = {name: (created, running) for name, created, running in
                result["trainwave"]["job_timeline"]}  # fmt: skip
    seen: dict[str, dict[str, float]] = {}
    for line in log.read_text(errors="replace").splitlines():
        match = LINE.match(line)
        if not match or not since <= match.group(2)[:8] <= until:
            continue
        job, message = match.group(3), match.group(4)
        at = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        times = seen.setdefault(job, {})
        if message.startswith("placed at creation"):
            times.setdefault("placed", at)
        elif "-> Starting" in message or "-> Scheduling" in message:
            times.setdefault("bound", at)
        elif "-> Running" in message:
            times.setdefault("running", at)
    known = {job: t for job, t in seen.items() if job in timeline}
    ran = [t["running"] - timeline[job][1] for job, t in known.items() if "running" in t]
    if not ran:
        return {}
    start = statistics.median(ran)
    slowest = sorted(timeline, key=lambda job: timeline[job][1] - timeline[job][0])[-5:]
    return {
        # Per slow job: seconds from its creation to its placement (the operator), then
        # from its placement to all workers Running (binding and kwok), None if not logged.
        "slowest": [
            _split(job, start + timeline[job][0], known.get(job, {})) for job in reversed(slowest)
        ],
        "created_to_placed_operator": quantiles(
            [t["placed"] - start - timeline[j][0] for j, t in known.items() if "placed" in t]
        ),
        "placed_to_all_running": quantiles(
            [
                t["running"] - t["placed"]
                for t in known.values()
                if {"placed", "running"} <= t.keys()
            ]
        ),
        "bound_to_all_running_when_seen": quantiles(
            [t["running"] - t["bound"] for t in known.values() if {"bound", "running"} <= t.keys()]
        ),
    }


def _split(job: str, created: float, logged: dict[str, float]) -> dict[str, Any]:
    placed = logged.get("placed")
    return {
        "job": job,
        "created_to_placed": _between(created, placed),
        "placed_to_all_running": _between(placed, logged.get("running")),
    }


def _between(earlier: float | None, later: float | None) -> float | None:
    return round(later - earlier, 1) if earlier is not None and later is not None else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("result", type=Path)
    parser.add_argument("log", type=Path)
    parser.add_argument("--since", default="00:00:00")
    parser.add_argument("--until", default="99:99:99")
    args = parser.parse_args()
    result = json.loads(args.result.read_text())
    print(json.dumps(stages(result, args.log, args.since, args.until), indent=2))


if __name__ == "__main__":
    main()
