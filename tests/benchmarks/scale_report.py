"""bench_scale's results: the figures of each phase summarised, and the Markdown report
beside the JSON (what docs/benchmarks/scale.md quotes)."""

from __future__ import annotations

import os
import platform
import statistics
import time
from typing import Any

from benchmarks.provenance import git_commit
from benchmarks.scale_measures import MACHINE_MIB, PLUMBING, PROFILE_RATE, LoadSampler
from benchmarks.scale_settings import (
    AUDIT_ALL,
    GOALS,
    GPUS,
    JOBS,
    OPERATOR_WORKERS,
    REPO,
    SMOKE,
    TOPOLOGY,
    WORKERS,
)
from benchmarks.summaries import percentile

# --- results -------------------------------------------------------------------------------


def quantiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    return {
        "p50": round(statistics.median(values), 1),
        "p99": round(percentile(values, 0.99), 1),
        "max": round(max(values), 1),
    }


def summarize(
    a: dict[str, Any], b: dict[str, Any], nodes: int, load: LoadSampler, seconds: float
) -> dict[str, Any]:
    worker = a.pop("worker_pod")
    resources = {c["name"]: c.get("resources", {}) for c in worker["spec"]["containers"]}
    ratio = (
        round(a["apply_to_all_running_seconds"] / b["apply_to_all_running_seconds"], 2)
        if a["apply_to_all_running_seconds"] and b["apply_to_all_running_seconds"]
        else None
    )
    rounds = a["placement_rounds"]
    figures = {
        "trainwave_over_bare": ratio,
        "job_p99_seconds": a["job_all_running_seconds"].get("p99"),
        "round_p99_seconds": rounds["p99_ms"] / 1000 if rounds.get("p99_ms") else None,
        "peak_rss_mib": a["operator_peak_rss_mib"],
    }
    goals = {
        name: {
            "goal": f"<= {GOALS[name]}" if name != "round_p99_seconds" else f"< {GOALS[name]}",
            "measured": value,
            "met": value is not None
            and (value < GOALS[name] if name == "round_p99_seconds" else value <= GOALS[name]),
        }
        for name, value in figures.items()
    }
    copies = b.get("as_workers") or {}
    over_copies = (
        round(a["apply_to_all_running_seconds"] / copies["apply_to_all_running_seconds"], 2)
        if a["apply_to_all_running_seconds"] and copies.get("apply_to_all_running_seconds")
        else None
    )
    return {
        "smoke": SMOKE,
        "goals": goals,
        "trainwave_over_worker_copies": over_copies,
        "trainwave": a,
        "bare_pods": b,
        "conditions": {
            "date": time.strftime("%Y-%m-%d %H:%M %Z"),
            "commit": git_commit(),
            "topology": f"{TOPOLOGY.relative_to(REPO)}: {nodes} nodes x 8 GPUs",
            "job_shape": f"{JOBS} TrainingJobs x {WORKERS} workers x {GPUS} GPU, never finishing",
            "worker_resources": resources,
            "worker_tolerations": worker["spec"].get("tolerations", []),
            "apply": "one `kubectl apply --server-side` per phase (serial PATCH per object)",
            "operator": f"1 process, {OPERATOR_WORKERS or 'default (8)'} reconcile workers, "
            "as the chart's ServiceAccount; "
            + (f"py-spy sampling it at {PROFILE_RATE}/s during phase A" if a["profile"]
               else "not profiled"),
            "requests": "kube-apiserver audit log (Metadata) of "
                        + ("every client (BENCH_AUDIT_ALL; the operator's requests are counted "
                           "from it alone)" if AUDIT_ALL else "the operator's ServiceAccount only")
                        + ", phase A from apply start until every job reported allRunningTime",
            "control_plane": "kube-apiserver/scheduler/controller-manager v1.34.4, etcd 3.5.1, "
                             "kwok v0.8.0; kwok marks bound pods Running at once",
            "machine": f"{os.cpu_count()} cores, {platform.machine()}, "
                       f"Python {platform.python_version()}; shared with other engineers' tests",
            "load_average_1m": {
                "before": load.samples[0][1] if load.samples else None,
                "trainwave": load.during("trainwave"),
                "kube_scheduler": load.during("kube-scheduler"),
                "jobs_alone": load.during("jobs-alone"),
            },
            "run_seconds": round(seconds, 1),
            "kernel": platform.release(),
        },
    }  # fmt: skip


def report(result: dict[str, Any]) -> str:
    a, b, c = result["trainwave"], result["bare_pods"], result["conditions"]
    rounds = a["placement_rounds"]
    decisions = a.get("placement_decisions") or {}
    goals = "\n".join(
        f"| {name} | {g['goal']} | {g['measured']} | {'met' if g['met'] else 'MISSED'} |"
        for name, g in result["goals"].items()
    )
    requests = a["operator_requests"]
    by_kind = "\n".join(f"  - {k}: {v}" for k, v in requests["by_verb_and_resource"].items())
    profile = a.get("profile") or {}
    top = "\n".join(
        f"| {frame} | {share:.1%} |"
        for frame, share in profile.get("top_cumulative", [])
        if not any(plumbing in frame for plumbing in PLUMBING)
    )
    top_self = "\n".join(
        f"| {frame} | {share:.1%} |" for frame, share in profile.get("top_self", [])[:12]
    )
    if profile.get("samples"):
        profile_text = f"""Profile of the operator in phase A (py-spy --gil: {profile["samples"]} samples, each taken
while a thread held the GIL, i.e. Python CPU time); share of samples with the function anywhere
on the stack:

| function | cumulative |
|---|---|
{top}

At the top of the stack (self):

| function | self |
|---|---|
{top_self}"""
    else:
        profile_text = "The operator was not profiled in this run."
    slowest = sorted(a.get("job_timeline", []), key=lambda t: t[2] - t[1])[-5:]
    tail = ", ".join(f"{n} (created +{c} s, all Running +{r} s)" for n, c, r in reversed(slowest))
    jobs = a["job_all_running_seconds"]
    conditions = "\n".join(f"- {k}: {v}" for k, v in c.items())
    title = "Scale benchmark" + (" (smoke run)" if result["smoke"] else "")
    return f"""# {title}: {c["job_shape"]} on {c["topology"]}

| figure | goal | measured | |
|---|---|---|---|
{goals}

Phase A, trainwave:

- started {a.get("settle_seconds", "?")} s after the cluster was ready: once the controller manager had annotated every node and posted its RegisteredNode Events (0: a cluster that was already up)
- {_quiet(a)}
- `kubectl apply --server-side` of {a["jobs"]} jobs: {a["apply_seconds"]} s
- apply start -> all {a["pods"]} workers Running: {a["apply_to_all_running_seconds"]} s (all Running: {a["all_running"]})
- per job, created -> all workers Running: p50 {jobs.get("p50")} / p99 {jobs.get("p99")} / max {jobs.get("max")} s ({a["jobs_reporting_all_running"]} jobs reported)
- placement rounds: {rounds.get("count")}, mean {rounds.get("mean_ms")} ms, p50 {rounds.get("p50_ms")} / p99 {">" if "p99_ms" in rounds.get("lower_bounds", []) else ""}{rounds.get("p99_ms")} ms (from histogram buckets; read the cache, decide, release the admitted gangs)
- of which the decision (snapshot + plan_round, no API calls): mean {decisions.get("mean_ms")} ms, p50 {decisions.get("p50_ms")} / p99 {">" if "p99_ms" in decisions.get("lower_bounds", []) else ""}{decisions.get("p99_ms")} ms
- gangs placed: {a["gangs_placed"]} ({a.get("gangs_placed_at_creation", 0)} created placed, the rest released from the gate); reconciles: {a["reconciles"]} (mean {a["mean_reconcile_ms"]} ms)
- operator API requests (audit log, watches excluded): {requests["total"]} in {requests["window_seconds"]} s, {a["operator_requests_per_placed_gang"]} per placed gang; {requests["watches_started"]} watches started:
{by_kind}
- kube-scheduler FailedScheduling in phase A: {a.get("failed_scheduling_events", "not recorded")}
- slowest jobs, times after the apply started: {tail or "not recorded"}
- {_stages(a.get("stages"))}
- operator peak RSS (VmHWM): {a["operator_peak_rss_mib"]} MiB; operator CPU since its start: {a["operator_cpu_seconds"]} s; apply start -> all Running: {a.get("operator_cpu_seconds_per_job")} s per job
- CPU seconds per process, apply start -> all Running: {a.get("cpu_seconds_until_all_running")}
- writes by client, apply start -> all Running (BENCH_AUDIT_ALL): {a.get("writes_by_client_until_all_running")}

Phase B, bare pods bound by kube-scheduler (operator stopped):

- {_quiet(b)}
- `kubectl apply --server-side` of {b["pods"]} pods: {b["apply_seconds"]} s
- apply start -> all {b["pods"]} pods Running: {b["apply_to_all_running_seconds"]} s (all Running: {b["all_running"]})
- CPU seconds per process, apply start -> all Running: {b.get("cpu_seconds_until_all_running")}
- writes by client, apply start -> all Running (BENCH_AUDIT_ALL): {b.get("writes_by_client_until_all_running")}

{_as_workers(a, b.get("as_workers"))}

Phase C, the same TrainingJobs with the operator stopped (nothing acts on them):

- `kubectl apply --server-side` of {a["jobs"]} jobs: {b.get("jobs_alone_apply_seconds")} s

{profile_text}

Conditions:
{conditions}
"""


def _stages(found: dict[str, Any] | None) -> str:
    """The operator log's stages (scale_stages.py): the operator's share and what followed."""
    if not found:
        return "stages: not recorded (no operator log of this phase)"
    placed, running = found["created_to_placed_operator"], found["placed_to_all_running"]
    slow = ", ".join(
        f"{j['job']} {j['created_to_placed']} + {j['placed_to_all_running']} s"
        for j in found["slowest"]
    )
    return (
        f"stages from the operator's log: created -> placed (the operator) p50 {placed.get('p50')}"
        f" / p99 {placed.get('p99')} s; placed -> all Running (binding, kwok) p50 "
        f"{running.get('p50')} / p99 {running.get('p99')} s; the slowest jobs, created -> placed +"
        f" placed -> all Running: {slow}"
    )


def _quiet(phase: dict[str, Any]) -> str:
    """How long the phase waited for a quiet control plane (scale_measures.QuietGate)."""
    quiet = phase.get("quiet_before")
    if quiet is None:
        return "started without waiting for a quiet control plane (a run before the gate)"
    state = "quiet" if quiet["quiet"] else "NOT quiet, started anyway"
    return (
        f"started once the control plane was {state}: {quiet['seconds']} s of "
        f"{quiet['cores_per_window']} cores per window (lowest of the run "
        f"{quiet['floor_cores']}); one core hashed {MACHINE_MIB} MiB in "
        f"{quiet.get('machine_seconds', '?')} s (machine_seconds: lower is faster)"
    )


def _as_workers(a: dict[str, Any], b: dict[str, Any] | None) -> str:
    if b is None:
        return "Phase B with the workers' own pods: not run (BENCH_BARE_AS_WORKERS=0)."
    ratio = (
        round(a["apply_to_all_running_seconds"] / b["apply_to_all_running_seconds"], 2)
        if a["apply_to_all_running_seconds"] and b["apply_to_all_running_seconds"]
        else None
    )
    return f"""Phase B again, with phase A's worker pods as the operator wrote them (labels,
annotations, environment; no owner, node pin or gate), bound by kube-scheduler:

- {_quiet(b)}
- `kubectl apply --server-side` of {b["pods"]} pods: {b["apply_seconds"]} s
- apply start -> all {b["pods"]} pods Running: {b["apply_to_all_running_seconds"]} s (all Running: {b["all_running"]}); trainwave over these: {ratio}x
- CPU seconds per process, apply start -> all Running: {b.get("cpu_seconds_until_all_running")}"""
