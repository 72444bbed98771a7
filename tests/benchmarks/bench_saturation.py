"""Benchmark: a cluster kept full by a seeded stream of gangs; how fast freed GPUs are reused.

Runs on its own local cluster (state directory bench-saturation-cluster) with the chart
installed and the operator running as its ServiceAccount. The stream (saturation_stream.py)
opens with a burst deeper than the cluster and keeps arriving faster than gangs finish;
every worker ends `run_seconds` after it starts (kwok). The benchmark's own watch on the
namespace's pods timestamps each worker's release (pinned and ungated), binding, Running
and end as it sees them (sub-second, unlike the API's 1 s timestamps), and
saturation_analysis.py turns those into hand-off lag (with its stages), GPU utilisation
while gangs wait against two bounds, makespan against two bounds, and waits by gang size.

Environment: BENCH_SATURATION (small: 64 nodes, a few minutes; uniform: the issue's 8-node gangs
at 1/16 the scale, about 2 minutes; mixed-runs: the small mix with runs of 15 s and 120 s, for
backfill with run bounds; large: the 1,024-node
topology), BENCH_SEED (2027), BENCH_TAG (appended to the results' name, e.g. "before"),
BENCH_KEEP_CLUSTER (0; 1 leaves the cluster up for a quick re-run), BENCH_STATE (the cluster's
state directory under the cache, bench-saturation-cluster), BENCH_MAX_SKIPS (the operator's
--queue-max-skips; unset: its default, 4), BENCH_MAX_RUN_SLACK (unset: no bound; a number
of seconds: every TrainingJob states runPolicy.maxRunSeconds = its run plus that, so the
queue may backfill onto held room, rule 9 of placement/queueing.py). Writes
tests/benchmarks/results/saturation-<config>[-vs-kueue][-<tag>].{json,md}.

BENCH_PEER=kueue runs the peer in the same invocation, right after trainwave's side, on the
same cluster and the same stream: the operator is stopped, Kueue started, and the gangs go
to Kueue as batch Jobs (saturation_kueue.py; BENCH_KUEUE_TAS=0 leaves Kueue's topology-aware
scheduling out). Both sides are then measured by the same functions (saturation_compare.py)
and the report ends with the side-by-side table.
"""

from __future__ import annotations

import os
import platform
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))

from benchmarks.operator_cluster import operator_cluster  # noqa: E402
from benchmarks.provenance import git_commit, write_results  # noqa: E402
from benchmarks.saturation_analysis import (  # noqa: E402
    GangSpan,
    PodSpan,
    makespan,
    quantiles,
    summarize_gangs,
    utilisation,
    waits_by_size,
)
from benchmarks.saturation_compare import (  # noqa: E402
    comparison_table,
    kueue_stages,
    side_figures,
)
from benchmarks.saturation_kueue import PeerRun, run_peer  # noqa: E402
from benchmarks.saturation_stream import (  # noqa: E402
    CONFIGS,
    NODE_GPUS,
    SatJob,
    make_stream,
    send_at_arrivals,
    training_job,
)
from benchmarks.saturation_watch import HoldWatch, PodWatch  # noqa: E402
from benchmarks.scale_measures import LoadSampler, parse_metrics  # noqa: E402
from cluster.api import ApiClient  # noqa: E402
from cluster.components import Layout  # noqa: E402
from cluster.kueue import KUEUE_VERSION  # noqa: E402
from trainwave import contract  # noqa: E402

CONFIG = CONFIGS[os.environ.get("BENCH_SATURATION", "small")]
if "BENCH_SEED" in os.environ:
    CONFIG = replace(CONFIG, seed=int(os.environ["BENCH_SEED"]))
TAG = os.environ.get("BENCH_TAG", "")
KEEP_CLUSTER = os.environ.get("BENCH_KEEP_CLUSTER", "0") == "1"
PEER = os.environ.get("BENCH_PEER", "")
if PEER not in ("", "kueue"):
    raise SystemExit(f"BENCH_PEER={PEER!r}: expected 'kueue' or nothing")
KUEUE_TAS = os.environ.get("BENCH_KUEUE_TAS", "1") == "1"
PEER_ENV = (f"BENCH_PEER={PEER} " + ("" if KUEUE_TAS else "BENCH_KUEUE_TAS=0 ")) if PEER else ""
TOPOLOGY = REPO / "tests" / "cluster" / "topologies" / f"{CONFIG.topology}.yaml"
NAMESPACE = "bench-saturation"
PEER_NAMESPACE = "bench-saturation-kueue"
STATE_NAME = os.environ.get("BENCH_STATE", "bench-saturation-cluster")
# The operator's --queue-max-skips (the chart's queue.maxSkips); unset: the operator's default.
MAX_SKIPS = os.environ.get("BENCH_MAX_SKIPS", "")
OPERATOR_ARGS = ("--queue-max-skips", MAX_SKIPS) if MAX_SKIPS else ()
_SLACK = os.environ.get("BENCH_MAX_RUN_SLACK", "")
MAX_RUN_SLACK = int(_SLACK) if _SLACK else None
RESULTS = (
    REPO
    / "tests"
    / "benchmarks"
    / "results"
    / (f"saturation-{CONFIG.name}" + ("-vs-kueue" if PEER else "") + (f"-{TAG}" if TAG else ""))
)
DRAIN_TIMEOUT = 1800.0
RACK_NODES = {"large": 16}.get(CONFIG.topology, 8)  # nodes a rack: large 16, medium-64 8
GOALS = {
    "handoff_p99_seconds": 2.0,
    "handoff_room_not_reserved_p99_seconds": 2.0,
    "handoff_not_held_p99_seconds": 2.0,
    "of_packable_bound": 0.95,
}


def main() -> int:
    started = time.monotonic()
    load = LoadSampler()
    load.start()
    stream = make_stream(CONFIG)
    with operator_cluster(
        TOPOLOGY, STATE_NAME, NAMESPACE, keep_cluster=KEEP_CLUSTER, operator_args=OPERATOR_ARGS
    ) as bench:
        client = ApiClient(bench.cluster.server, Layout(bench.cluster.state_dir).pki, timeout=60)
        print(f"cluster ready in {time.monotonic() - started:.0f}s", flush=True)
        metrics_before = parse_metrics(bench.operator.metrics())
        watcher = PodWatch(bench.cluster, NAMESPACE)
        watcher.start()
        holds = HoldWatch(bench.cluster, NAMESPACE, watcher.t0)
        holds.start()
        load.enter("stream")
        arrivals = submit(client, stream, watcher.t0)
        finished = wait_drained(watcher, stream)
        load.enter("after")
        metrics_after = parse_metrics(bench.operator.metrics())
        watcher.stop()
        holds.stop()
        peer = None
        if PEER == "kueue":
            bench.operator.stop()  # idle by now, but its watches are no part of the peer
            print("peer: Kueue", flush=True)
            load.enter("peer")
            peer = run_peer(
                bench.cluster, client, bench.workdir / "kueue", stream, PEER_NAMESPACE,
                tas=KUEUE_TAS, drain_timeout=DRAIN_TIMEOUT,
            )  # fmt: skip
            load.enter("after peer")
    gangs = gang_spans(stream, arrivals, watcher.pods)
    result = summarize(
        stream,
        gangs=gangs,
        finished=finished,
        watcher=watcher,
        held=holds.held,
        holders=holds.holders,
        protected_since=holds.protected_since,
        racks=holds.racks,
        load=load,
        before=metrics_before,
        after=metrics_after,
    )
    if peer is not None:
        result["peer"] = peer_result(
            stream, gangs, finished=finished, watcher=watcher, peer=peer, load=load
        )
    result["conditions"]["run_seconds"] = round(time.monotonic() - started, 1)
    text = report(result) + (peer_report(result["peer"]) if peer is not None else "")
    write_results(RESULTS, result, text)
    print(text)
    return 0


def submit(client: ApiClient, stream: list[SatJob], t0: float) -> dict[str, float]:
    """Create each job at its arrival time; its arrival is when the create was sent."""
    path = f"/apis/{contract.API_VERSION}/namespaces/{NAMESPACE}/trainingjobs"
    arrivals = send_at_arrivals(
        lambda job: client.request("POST", path, training_job(job, NAMESPACE, MAX_RUN_SLACK)),
        stream,
        t0,
    )
    print(f"submitted {len(stream)} jobs in {time.time() - t0:.0f}s", flush=True)
    return arrivals


def wait_drained(watcher: PodWatch, stream: list[SatJob]) -> bool:
    """Until every worker of every job has ended (or the timeout)."""
    total = sum(job.workers for job in stream)
    deadline = time.time() + DRAIN_TIMEOUT
    while time.time() < deadline:
        pods = list(watcher.pods.values())
        ended = sum(1 for p in pods if "ended" in p)
        if ended >= total:
            return True
        time.sleep(1.0)
    return False


def gang_spans(
    stream: list[SatJob], arrivals: dict[str, float], pods: dict[str, dict[str, Any]]
) -> list[GangSpan]:
    by_job: dict[str, list[PodSpan]] = {}
    for seen in pods.values():
        if "node" not in seen:
            continue
        span = PodSpan(
            seen["job"], seen["node"], NODE_GPUS, seen.get("released"), seen.get("bound"),
            seen.get("running"), seen.get("ended"),
        )  # fmt: skip
        by_job.setdefault(seen["job"], []).append(span)
    return [
        GangSpan(
            job.name,
            job.workers,
            job.gpus,
            arrivals[job.name],
            job.run_seconds,
            tuple(by_job.get(job.name, ())),
        )
        for job in stream
        if job.name in arrivals
    ]


def summarize(
    stream: list[SatJob],
    *,
    gangs: list[GangSpan],
    finished: bool,
    watcher: PodWatch,
    held: dict[str, list[tuple[float, str]]],
    holders: dict[str, set[str]],
    protected_since: dict[str, float],
    racks: dict[str, int],
    load: LoadSampler,
    before: dict[str, float],
    after: dict[str, float],
) -> dict[str, Any]:
    capacity = CONFIG.nodes * NODE_GPUS
    handoff = summarize_gangs(gangs, NODE_GPUS, held, holders)
    use = utilisation(gangs, capacity)
    span = makespan(gangs, capacity, CONFIG.nodes)
    waits = waits_by_size(gangs)
    largest = waits.get(f"{max(j.workers for j in stream)} nodes", {})
    failed = sum(1 for p in watcher.pods.values() if p.get("phase") not in (None, "Succeeded"))
    figures = {
        "handoff_p99_seconds": handoff["handoff_lag_seconds"].get("p99"),
        "handoff_room_not_reserved_p99_seconds": handoff[
            "handoff_lag_room_not_reserved_seconds"
        ].get("p99"),
        "handoff_not_held_p99_seconds": handoff["handoff_lag_not_held_seconds"].get("p99"),
        "of_packable_bound": use["of_packable_bound"],
    }
    goals = {
        name: {
            "goal": ("<= " if name.endswith("seconds") else ">= ") + str(GOALS[name]),
            "measured": value,
            "met": value is not None
            and (value <= GOALS[name] if name.endswith("seconds") else value >= GOALS[name]),
        }
        for name, value in figures.items()
    }

    def delta(name: str) -> float:
        return round(after.get(name, 0.0) - before.get(name, 0.0), 3)

    rounds = delta("trainwave_placement_round_duration_seconds_count")
    return {
        "config": asdict(CONFIG),
        "goals": goals,
        "all_finished": finished,
        "pods_not_succeeded": failed,
        "handoff": handoff,
        "utilisation": use,
        "makespan": span,
        "wait_seconds_by_gang_size": waits,
        "largest_gangs_wait_p95_seconds": largest.get("p95"),
        "protected_gangs": protected_waits(gangs, protected_since),
        "locality": locality(stream, racks),
        "operator": {
            "placement_rounds": rounds,
            "mean_round_ms": round(
                1000 * delta("trainwave_placement_round_duration_seconds_sum") / rounds, 1
            )
            if rounds
            else None,
            "gangs_placed": delta("trainwave_gangs_placed_total"),
            "gangs_placed_at_creation": delta("trainwave_gangs_placed_at_creation_total"),
            "gangs_on_held_room": delta("trainwave_gangs_backfilled_on_held_room_total"),
            "reconciles": delta("trainwave_reconcile_duration_seconds_count"),
        },
        "held_by_policy": held,
        "held_for": {name: sorted(names) for name, names in holders.items()},
        "watch": {
            "restarts": watcher.restarts,
            "errors": watcher.errors[:5],
            "t0_epoch": watcher.t0,
        },
        "pods": watcher.pods,
        "stream": [asdict(job) for job in stream],
        "conditions": {
            "date": time.strftime("%Y-%m-%d %H:%M %Z"),
            "commit": git_commit(),
            "topology": f"{TOPOLOGY.relative_to(REPO)}: {CONFIG.nodes} nodes x {NODE_GPUS} GPUs",
            "stream": f"{CONFIG.jobs} TrainingJobs (seed {CONFIG.seed}), {CONFIG.burst} at "
            f"second 0, the rest at {CONFIG.overload}x the cluster's node-seconds per second; "
            f"(workers x 8 GPUs, weight): {list(CONFIG.sizes)}; each worker runs one of "
            f"{list(CONFIG.runs)} s; runPolicy.maxRunSeconds "
            + ("not set" if MAX_RUN_SLACK is None else f"= the run + {MAX_RUN_SLACK} s"),
            "timing": "the benchmark's own pod watch (time seen, sub-second)",
            "control_plane": "kube-apiserver/scheduler/controller-manager v1.34.4, etcd 3.5.1, "
            "kwok v0.8.0 (a bound pod Running at once; a worker ends run-for after startTime, "
            "which has 1 s resolution)",
            "operator": f"1 process, {' '.join(OPERATOR_ARGS) or 'default flags'}, as the "
            "chart's ServiceAccount",
            "machine": f"{os.cpu_count()} cores, {platform.machine()}, Python "
            f"{platform.python_version()}; shared with other engineers' tests",
            "load_average_1m": {
                "before": load.samples[0][1] if load.samples else None,
                "stream": load.during("stream"),
            },
        },
    }


def peer_result(
    stream: list[SatJob],
    gangs: list[GangSpan],
    *,
    finished: bool,
    watcher: PodWatch,
    peer: PeerRun,
    load: LoadSampler,
) -> dict[str, Any]:
    """Both sides through the same functions, and what the peer's queue was."""
    shape = {"nodes": CONFIG.nodes, "node_gpus": NODE_GPUS, "rack_nodes": RACK_NODES}
    ours = side_figures(gangs, watcher.pods, finished=finished, **shape)
    peer_gangs = gang_spans(stream, peer.arrivals, peer.watcher.pods)
    theirs = side_figures(peer_gangs, peer.watcher.pods, finished=peer.finished, **shape)
    return {
        "table": comparison_table(ours, theirs),
        "trainwave": ours,
        "kueue": theirs,
        "kueue_stages_seconds": kueue_stages(peer_gangs, peer.workloads, NODE_GPUS),
        "workloads": peer.workloads,
        "kueue_setup": peer.setup | {"version": KUEUE_VERSION, "api_version": peer.api_version},
        "order": "trainwave first, then Kueue, on the same cluster (operator stopped)",
        "load_average_1m": {"trainwave": load.during("stream"), "kueue": load.during("peer")},
        "watch": {"restarts": peer.watcher.restarts, "errors": peer.watcher.errors[:5]},
        "pods": peer.watcher.pods,
    }


def peer_report(peer: dict[str, Any]) -> str:
    setup, loads = peer["kueue_setup"], peer["load_average_1m"]
    tas = setup["topology_aware_scheduling"]
    stages = "\n".join(f"- {name}: {fmt(q)} s" for name, q in peer["kueue_stages_seconds"].items())
    return f"""
## trainwave and Kueue, same stream, same cluster, one after the other

Kueue {setup["version"]} ({setup["api_version"]}): the same gangs as batch Jobs, one ClusterQueue
({setup["queueing_strategy"]}) with the whole cluster as quota ({setup["quota"]}), all-or-nothing
admission, configuration as its install ships it plus waitForPodsReady
({setup["configuration"]}), topology-aware scheduling:
{"levels " + " / ".join(tas) + ", each Job preferring one " + setup["preferred_topology"] if tas != "off" else "off"};
placed by kube-scheduler. Order: {peer["order"]}. 1-min load: trainwave {loads["trainwave"]},
Kueue {loads["kueue"]}. Stage "released": trainwave's operator pinned and ungated the worker;
for Kueue, the Job's pod exists without a scheduling gate (admitted, unsuspended, created by
the Job controller and, with TAS, ungated with its node).

{peer["table"]}

Kueue's hand-off, split by its Workloads' conditions (time the watch saw them):
{stages}
"""


def protected_waits(gangs: list[GangSpan], since: dict[str, float]) -> dict[str, Any]:
    """The wait of each gang the queue protected: from protection, and from arrival. The
    wait after protection is what bounded backfill bounds (the longest run remaining on
    the nodes it can use, plus the hand-off)."""
    after, whole = [], []
    for gang in gangs:
        start = gang.start
        if gang.name in since and start is not None:
            after.append(start - since[gang.name])
            whole.append(start - gang.arrival)
    return {"after_protection_seconds": quantiles(after), "wait_seconds": quantiles(whole)}


def locality(stream: list[SatJob], racks: dict[str, int]) -> dict[str, int]:
    """Gangs that fit one rack (the topology's racks hold 8 nodes) by how many racks their
    placement summary named."""
    fits = [job.name for job in stream if job.workers <= RACK_NODES]
    return {
        "one_rack": sum(1 for name in fits if racks.get(name) == 1),
        "spread": sum(1 for name in fits if racks.get(name, 0) > 1),
        "unknown": sum(1 for name in fits if name not in racks),
    }


def report(result: dict[str, Any]) -> str:
    c, h, u, m = result["conditions"], result["handoff"], result["utilisation"], result["makespan"]
    goals = "\n".join(
        f"| {name} | {g['goal']} | {g['measured']} | {'met' if g['met'] else 'MISSED'} |"
        for name, g in result["goals"].items()
    )
    stages = "\n".join(
        f"| {stage} | {fmt(q)} |" for stage, q in h["handoff_stages_seconds"].items()
    )
    waits = "\n".join(
        f"| {size} | {fmt(q)} | {q.get('never_started', 0)} |"
        for size, q in result["wait_seconds_by_gang_size"].items()
    )
    op = result["operator"]
    held_text = (
        "; ".join(
            f"{reason}: {fmt(q)}" for reason, q in h["handoff_lag_held_by_policy_seconds"].items()
        )
        or "none"
    )
    conditions = "\n".join(f"- {k}: {v}" for k, v in c.items())
    return f"""# Saturation benchmark ({result["config"]["name"]}): {c["topology"]}

| figure | goal | measured | |
|---|---|---|---|
{goals}

All jobs finished: {result["all_finished"]}; pods that did not succeed: {result["pods_not_succeeded"]}.

Hand-off lag (a gang that waited for room: last worker Running minus the moment its room
appeared): {fmt(h["handoff_lag_seconds"])} s. Of those, gangs the queue did not hold by policy
after their room appeared: {fmt(h["handoff_lag_not_held_seconds"])} s; held (the room kept for an earlier
gang, or waiting for one domain of the preferred level, by reason): {held_text} s. Gangs that found room at once, arrival -> all
Running: {fmt(h["found_room_at_once_start_seconds"])} s. Hand-off lag with the room counted only
once no earlier gang had it reserved (a gang held for an earlier one: from that gang's
release): {fmt(h["handoff_lag_room_not_reserved_seconds"])} s.

| stage of the hand-off | seconds |
|---|---|
{stages}

Slowest hand-offs (gang, room appeared, started, lag; seconds after the stream began):
{h["slowest_handoffs"]}

GPU utilisation while gangs wait ({u["seconds_with_gangs_waiting"]} s): {u["utilisation_while_waiting"]}
of all GPUs; {u["of_fluid_bound"]} of the fluid bound, {u["of_packable_bound"]} of the packable
bound (whole waiting gangs that fit the free GPUs).

Makespan: {m["measured_seconds"]} s; fluid bound {m["fluid_bound_seconds"]} s
({m["over_fluid"]}x), zero-lag greedy packing {m["zero_lag_greedy_seconds"]} s ({m["over_zero_lag_greedy"]}x).

| gang size | wait (arrival -> all Running), s | never started |
|---|---|---|
{waits}

Protected gangs (overtaken max_skips times, then every node they can use held for them), from
the first hold naming them (status, up to about 1 s late) to all Running:
{fmt(result["protected_gangs"]["after_protection_seconds"])} s; their whole wait (arrival -> all Running):
{fmt(result["protected_gangs"]["wait_seconds"])} s.

Locality (the price of starting spread rather than waiting for one rack): of the gangs
one rack could hold, {result["locality"]["one_rack"]} started in one rack and
{result["locality"]["spread"]} over several ({result["locality"]["unknown"]} not seen).

Operator: {op["placement_rounds"]} placement rounds (mean {op["mean_round_ms"]} ms), {op["gangs_placed"]} gangs
placed ({op["gangs_placed_at_creation"]} at creation, {op.get("gangs_on_held_room", 0)} backfilled onto held
room with a run bound), {op["reconciles"]} reconciles.

Conditions:
{conditions}

Reproduce: `{PEER_ENV}make bench-saturation` (or `{PEER_ENV}BENCH_SATURATION={result["config"]["name"]} python tests/benchmarks/bench_saturation.py`).
"""


def fmt(q: dict[str, float]) -> str:
    if not q.get("count"):
        return "none"
    return f"p50 {q['p50']} / p95 {q['p95']} / p99 {q['p99']} / max {q['max']} (n={q['count']})"


if __name__ == "__main__":
    sys.exit(main())
