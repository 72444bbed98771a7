"""Benchmark: gang placement under scheduling constraints the GPU count cannot see (issue 9).

One local cluster (tests/cluster/topologies/medium-64.yaml: 8 racks x 8 nodes x 8 GPUs, 192
CPUs and 2 TiB each), chart installed, operator running as its ServiceAccount
(benchmarks/operator_cluster.py). Before any job:

- racks VISION_RACKS are tainted team=vision:NoSchedule;
- racks POOL_RACKS are labelled POOL_LABEL=blue;
- foreign pods (not trainwave) are bound by name to seeded nodes: CPU hogs (150 CPUs,
  256 GiB, no GPU) and GPU holders (4 GPUs, 8 CPUs).

Then a seeded stream (BENCH_SEED, default 2026) of BENCH_JOBS (default 300) TrainingJobs,
each 1-8 workers x 1/2/4/8 GPUs and one of: plain, tolerating the vision taint, selecting
the blue pool, CPU-heavy (160 CPUs per worker: no room next to a CPU hog) or memory-heavy
(1800 GiB per worker: no room next to a hog's 256 GiB). Each runs a seeded 3-15 s (sim
annotations) and succeeds, so the cluster churns; at most IN_FLIGHT jobs are unfinished at
once, and a finished job is deleted.

Measured: (a) re-plans after a bind timeout (status.attempt > 0 or a BindTimeout reason;
goal 0); (b) released pods kube-scheduler did not bind at the first try (a FailedScheduling
Event, or PodScheduled=False reason Unschedulable seen on an ungated pod; goal 0); (c) for
multi-node jobs (> 8 GPUs), the share placed inside one rack among those for which some
rack had room, judged with trainwave's own filters (slots per node for the worker's pod,
every resource, taint and selector) on the last poll before the job was seen placed (goal
100%), and again counting only jobs whose rack still had room on the poll that saw them
placed, everything else placed by then included (what the same placement round took first);
released pods not yet bound count on the node they are pinned to. Jobs completed, wall time.

Run: `make bench` or `python tests/benchmarks/bench_constraints.py`.
Env: BENCH_JOBS (default 300; 20 for a smoke run), BENCH_SEED, BENCH_TIMEOUT (s, default 1500).
Writes tests/benchmarks/results/constraints.{json,md}.
"""

from __future__ import annotations

import json
import os
import platform
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "operator"), str(REPO / "tests")]

from kubernetes import client  # noqa: E402

from benchmarks.gang_arrivals import Api  # noqa: E402
from benchmarks.operator_cluster import operator_cluster  # noqa: E402
from benchmarks.placement_quality import Fleet, Quality  # noqa: E402
from benchmarks.provenance import git_commit, write_results  # noqa: E402
from benchmarks.summaries import spread  # noqa: E402
from trainwave import contract  # noqa: E402
from trainwave.placement.requirements import pod_needs  # noqa: E402
from trainwave.placement.snapshot import build_snapshot  # noqa: E402

JOBS = int(os.environ.get("BENCH_JOBS", "300"))
SEED = int(os.environ.get("BENCH_SEED", "2026"))
TIMEOUT = float(os.environ.get("BENCH_TIMEOUT", "1500"))
TOPOLOGY = REPO / "tests" / "cluster" / "topologies" / "medium-64.yaml"
NAMESPACE = "bench-constraints"
RESULTS = REPO / "tests" / "benchmarks" / "results" / "constraints"
RACK_LABEL = contract.NODE_LABEL_RACK
VISION_RACKS = ("rack-06", "rack-07")
POOL_RACKS = ("rack-04", "rack-05")
POOL_LABEL = "bench.trainwave.io/pool"
CPU_HOGS, GPU_HOLDERS = 8, 8
IN_FLIGHT = 40
POLL_SECONDS = 1.0
NODE_GPUS = 8
TOLERATION = {"key": "team", "operator": "Equal", "value": "vision", "effect": "NoSchedule"}
KINDS = (("plain", 35), ("tolerating", 20), ("selector", 15), ("cpu-heavy", 15),
         ("memory-heavy", 15))  # fmt: skip
WORKERS = ((1, 20), (2, 20), (3, 10), (4, 20), (6, 10), (8, 20))
GPUS = ((1, 15), (2, 20), (4, 30), (8, 35))


@dataclass(frozen=True)
class Spec:
    name: str
    kind: str
    workers: int
    gpus: int
    run_seconds: int

    def manifest(self) -> dict[str, Any]:
        requests = {"cpu": str(4 * self.gpus), "memory": f"{32 * self.gpus}Gi"}
        template: dict[str, Any] = {}
        if self.kind == "cpu-heavy":
            requests["cpu"] = "160"
        elif self.kind == "memory-heavy":
            requests["memory"] = "1800Gi"
        elif self.kind == "tolerating":
            template["tolerations"] = [TOLERATION]
        elif self.kind == "selector":
            template["nodeSelector"] = {POOL_LABEL: "blue"}
        annotations = {"sim.trainwave.io/result": "Succeeded",
                       "sim.trainwave.io/run-for": f"{self.run_seconds}s"}  # fmt: skip
        return {
            "apiVersion": contract.API_VERSION,
            "kind": contract.KIND,
            "metadata": {"name": self.name},
            "spec": {
                "workers": self.workers,
                "gpusPerWorker": self.gpus,
                "image": "bench/worker:1",
                "command": ["python", "train.py"],
                "resources": {"requests": requests},
                "template": {"metadata": {"annotations": annotations}, "spec": template},
            },
        }


def make_stream(seed: int, count: int) -> list[Spec]:
    rng = random.Random(seed)

    def pick(table):
        return rng.choices([v for v, _ in table], [w for _, w in table])[0]

    specs = []
    for i in range(count):
        kind, workers, gpus = pick(KINDS), pick(WORKERS), pick(GPUS)
        specs.append(Spec(f"c-{i:03d}-{kind}-{workers}x{gpus}", kind, workers, gpus,
                          rng.randint(3, 15)))  # fmt: skip
    return specs


def foreign_pods(rng: random.Random, nodes: list[str]) -> list[dict[str, Any]]:
    chosen = rng.sample(nodes, CPU_HOGS + GPU_HOLDERS)
    pods = []
    for i, node in enumerate(chosen):
        hog = i < CPU_HOGS
        resources: dict[str, Any] = (
            {"requests": {"cpu": "150", "memory": "256Gi"}}
            if hog
            else {"requests": {"cpu": "8"}, "limits": {contract.GPU_RESOURCE: "4"}}
        )
        pods.append({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"foreign-{'cpu' if hog else 'gpu'}-{i}",
                         "labels": {"bench.trainwave.io/foreign": "true"}},
            "spec": {"nodeName": node, "tolerations": [TOLERATION], "containers": [
                {"name": "c", "image": "busybox", "resources": resources}]},
        })  # fmt: skip
    return pods


@dataclass
class Tracked:
    spec: Spec
    submitted: float
    placed: float | None = None
    nodes: list[str] = field(default_factory=list)
    room: bool | None = None  # some rack had room, on the last poll before it was placed
    # Some rack had room once every other pod placed by the poll that saw it placed is
    # counted (same-round placements included): False means it lost the race, not a miss.
    room_after: bool | None = None
    best_rack_slots: int = 0  # most workers one rack could take, on the poll before
    placer_summary: str = ""  # rank 0's placement annotation: what the placer's snapshot saw
    phase: str = ""
    attempt: int = 0
    bind_timeout: bool = False
    scheduled: str = ""


def prepare(api: Api, bench: Any, rng: random.Random) -> list[dict[str, Any]]:
    nodes = api.nodes()
    by_rack: dict[str, list[str]] = {}
    for node in nodes:
        by_rack.setdefault(node["metadata"]["labels"][RACK_LABEL], []).append(
            node["metadata"]["name"]
        )
    kubectl = bench.cluster.kubectl
    kubectl("taint", "nodes", *[n for r in VISION_RACKS for n in by_rack[r]],
            "team=vision:NoSchedule", "--overwrite")  # fmt: skip
    kubectl("label", "nodes", *[n for r in POOL_RACKS for n in by_rack[r]],
            f"{POOL_LABEL}=blue", "--overwrite")  # fmt: skip
    names = sorted(n["metadata"]["name"] for n in nodes)
    for pod in foreign_pods(rng, names):
        api.core.create_namespaced_pod(NAMESPACE, pod)
    return api.nodes()


def run(api: Api, stream: list[Spec], nodes: list[dict[str, Any]]) -> dict[str, Any]:
    fleet = Fleet(build_snapshot(nodes, []))
    pending = list(stream)
    jobs: dict[str, Tracked] = {}
    unbound_after_release: set[str] = set()
    started = time.monotonic()
    timed_out = False
    while pending or any(not t.phase for t in jobs.values()):
        if time.monotonic() - started > TIMEOUT:
            timed_out = True
            break
        active = sum(not t.phase for t in jobs.values())
        while pending and active < IN_FLIGHT:
            spec = pending.pop(0)
            api.custom.create_namespaced_custom_object(
                contract.GROUP, contract.VERSION, NAMESPACE, contract.PLURAL, spec.manifest()
            )
            jobs[spec.name] = Tracked(spec, time.monotonic())
            active += 1
        time.sleep(POLL_SECONDS)
        nodes = api.nodes()
        pods = [pinned(p) for p in api.pods(all_namespaces=True)]
        snapshot = build_snapshot(nodes, pods)
        workers: dict[str, list[dict[str, Any]]] = {}
        for pod in pods:
            job_name = (pod["metadata"].get("labels") or {}).get(contract.LABEL_JOB_NAME)
            if job_name in jobs:
                workers.setdefault(job_name, []).append(pod)
            gated = any(g.get("name") == contract.SCHEDULING_GATE
                        for g in pod["spec"].get("schedulingGates") or [])  # fmt: skip
            for c in (pod.get("status") or {}).get("conditions") or []:
                if c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable" and not gated:
                    unbound_after_release.add(pod["metadata"]["name"])
        bodies = api.custom.list_namespaced_custom_object(
            contract.GROUP, contract.VERSION, NAMESPACE, contract.PLURAL
        )["items"]
        for body in bodies:
            tracked = jobs.get(body["metadata"]["name"])
            if tracked is None or tracked.phase:
                continue
            observe(tracked, body.get("status") or {}, workers, snapshot, fleet)
            if tracked.placed is not None and tracked.room_after is None:
                others = [p for p in pods if p not in workers.get(tracked.spec.name, [])]
                best = rack_room(build_snapshot(nodes, others), fleet,
                                 workers[tracked.spec.name][0])  # fmt: skip
                tracked.room_after = best >= tracked.spec.workers
            if tracked.phase:
                api.custom.delete_namespaced_custom_object(
                    contract.GROUP, contract.VERSION, NAMESPACE, contract.PLURAL,
                    tracked.spec.name, propagation_policy="Background",
                )  # fmt: skip
    wall = time.monotonic() - started
    raw = client.EventsV1Api(api.api).list_namespaced_event(NAMESPACE, _preload_content=False)
    events = json.loads(raw.data)["items"]
    failed_scheduling = {
        e["regarding"]["name"] for e in events if e.get("reason") == "FailedScheduling"
    }
    bind_timeout_events = sum(e.get("reason") == "BindTimeout" for e in events)
    notes = Counter(
        f"{e['regarding']['name']}: {e.get('note', '')}"[:300]
        for e in events if e.get("reason") == "FailedScheduling"
    )  # fmt: skip
    return {"failed_scheduling_notes": dict(notes.most_common(20))} | summarize(
                     jobs, fleet, unbound_after_release | failed_scheduling,
                     bind_timeout_events=bind_timeout_events, wall=wall, timed_out=timed_out)  # fmt: skip


def observe(tracked: Tracked, status: dict[str, Any], workers: dict[str, list[Any]],
            snapshot: Any, fleet: Fleet) -> None:  # fmt: skip
    """Update one job from this poll: where its ranks went, whether a rack had room."""
    mine = sorted(workers.get(tracked.spec.name, []),
                  key=lambda p: int(p["metadata"]["labels"][contract.LABEL_RANK]))  # fmt: skip
    bound = [p["spec"].get("nodeName") for p in mine]
    if tracked.placed is None and len(mine) == tracked.spec.workers and all(bound):
        tracked.placed, tracked.nodes = time.monotonic(), bound
        notes = mine[0]["metadata"].get("annotations") or {}
        tracked.placer_summary = notes.get(contract.ANNOTATION_PLACEMENT_SUMMARY, "")
    elif tracked.placed is None and mine and not any(bound):
        tracked.best_rack_slots = rack_room(snapshot, fleet, mine[0])
        tracked.room = tracked.best_rack_slots >= tracked.spec.workers
    tracked.attempt = max(tracked.attempt, int(status.get("attempt") or 0))
    reasons = [c.get("reason") for c in status.get("conditions") or []]
    tracked.bind_timeout |= "BindTimeout" in reasons
    scheduled = next((c for c in status.get("conditions") or []
                      if c["type"] == "Scheduled"), {})  # fmt: skip
    if scheduled.get("status") == "False":
        tracked.scheduled = f"{scheduled.get('reason')}: {scheduled.get('message')}"
    if status.get("phase") in ("Succeeded", "Failed"):
        tracked.phase = status["phase"]


def pinned(pod: dict[str, Any]) -> dict[str, Any]:
    """A released pod kube-scheduler has not bound yet, as bound to the node it is pinned to:
    its room is taken already."""
    node = (pod["metadata"].get("annotations") or {}).get(contract.ANNOTATION_PLACED_NODE)
    if not node or pod["spec"].get("nodeName") or pod["spec"].get("schedulingGates"):
        return pod
    return pod | {"spec": pod["spec"] | {"nodeName": node}}


def rack_room(snapshot: Any, fleet: Fleet, pod: dict[str, Any]) -> int:
    """The most workers like `pod` that one rack can take (trainwave's own filters)."""
    spec = pod["spec"] | {"nodeName": None, "schedulingGates": None}
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if required:
        # A released worker is pinned by a matchFields term on its node; judge it unpinned.
        terms = []
        for term in required.get("nodeSelectorTerms") or []:
            fields = [f for f in term.get("matchFields") or [] if f.get("key") != "metadata.name"]
            kept = {k: v for k, v in term.items() if k != "matchFields"}
            kept |= {"matchFields": fields} if fields else {}
            if kept:
                terms.append(kept)
        node_affinity = {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": terms}} if terms else {}  # fmt: skip
        spec = spec | {"affinity": {"nodeAffinity": node_affinity}}
    slots = snapshot.slots(pod_needs({"spec": spec}))
    room = [0] * fleet.racks
    for index, free in enumerate(slots):
        room[fleet.rack_of[index]] += free
    return max(room)


def summarize(jobs, fleet, unbound, *, bind_timeout_events, wall, timed_out) -> dict[str, Any]:
    quality, quality_after, spread_with_room = Quality(), Quality(), []
    for t in jobs.values():
        if t.nodes and t.spec.workers * t.spec.gpus > NODE_GPUS:
            racks = fleet.racks_of(t.nodes)
            quality.record(bool(t.room), racks)
            quality_after.record(bool(t.room and t.room_after), racks)
            if t.room and len(set(racks)) > 1:
                spread_with_room.append({
                    "job": t.spec.name, "racks": racks, "room_after": t.room_after,
                    "best_rack_slots_before": t.best_rack_slots,
                    "placer": t.placer_summary,
                })  # fmt: skip
    replanned = [t.spec.name for t in jobs.values() if t.attempt > 0 or t.bind_timeout]
    waits = [t.placed - t.submitted for t in jobs.values() if t.placed is not None]
    return {
        "jobs_submitted": len(jobs),
        "jobs_completed": sum(t.phase == "Succeeded" for t in jobs.values()),
        "jobs_failed": sum(t.phase == "Failed" for t in jobs.values()),
        "timed_out": timed_out,
        "wall_seconds": round(wall, 1),
        "by_kind": dict(sorted(Counter(t.spec.kind for t in jobs.values()).items())),
        "bind_timeout_replans": len(replanned),
        "bind_timeout_replanned_jobs": replanned[:20],
        "bind_timeout_events": bind_timeout_events,
        "pods_not_bound_first_try": len(unbound),
        "pods_not_bound_first_try_names": sorted(unbound)[:20],
        "quality": quality.summary(),
        "quality_room_kept": quality_after.summary(),
        "spread_although_a_rack_had_room": spread_with_room[:40],
        "submit_to_all_bound_seconds": spread(waits, 2),
        "never_placed": [
            {"job": t.spec.name, "scheduled": t.scheduled[:300]}
            for t in jobs.values()
            if t.placed is None
        ][:20],
    }


def conditions(load_before: float, load_after: float) -> dict[str, Any]:
    kinds = ", ".join(f"{k} {w}%" for k, w in KINDS)
    return {
        "topology": f"{TOPOLOGY.relative_to(REPO)}: 64 nodes x 8 H100, 192 CPU, 2 TiB; "
                    "8 racks x 8 nodes",
        "constraints": f"racks {', '.join(VISION_RACKS)} tainted team=vision:NoSchedule; "
                       f"racks {', '.join(POOL_RACKS)} labelled {POOL_LABEL}=blue; "
                       f"{CPU_HOGS} foreign CPU hogs (150 CPU, 256Gi) and {GPU_HOLDERS} "
                       "foreign GPU holders (4 GPUs) bound by name to seeded nodes",
        "stream": f"{JOBS} jobs, seed {SEED}; kinds: {kinds}; workers {WORKERS}; "
                  f"GPUs per worker {GPUS} (value, weight); per worker 4 CPU + 32Gi per GPU, "
                  "cpu-heavy 160 CPU, memory-heavy 1800Gi; runs 3-15 s then succeeds",
        "arrivals": f"at most {IN_FLIGHT} unfinished jobs; polled every {POLL_SECONDS} s; "
                    "finished jobs deleted",
        "timeout_seconds": TIMEOUT,
        "machine": f"{os.cpu_count()} cores, {platform.machine()}, "
                   f"Python {platform.python_version()}; control plane, kwok, operator "
                   "and this driver share these cores",
        "load_average_1m": {"start": load_before, "end": load_after},
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "commit": git_commit(),
    }  # fmt: skip


def report(result: dict[str, Any]) -> str:
    q, qa = result["quality"], result["quality_room_kept"]
    bound = result["submit_to_all_bound_seconds"]
    never = "\n".join(f"- {n['job']}: {n['scheduled']}" for n in result["never_placed"]) or "- none"
    failed = (
        "\n".join(
            f"- {note} (x{count})"
            for note, count in result.get("failed_scheduling_notes", {}).items()
        )
        or "- none"
    )
    text = "\n".join(f"- {k}: {v}" for k, v in result["conditions"].items())
    spreads = (
        "\n".join(
            f"- {s['job']}: racks {s['racks']}; the poll before: a rack with room for "
            f"{s['best_rack_slots_before']}; room kept after the same poll's placements: "
            f"{s['room_after']}; the placer: {s.get('placer') or '-'}"
            for s in result["spread_although_a_rack_had_room"]
        )
        or "- none"
    )
    placed = result.get("gangs_placed") or {}
    return f"""# Placement under constraints (taints, selectors, CPU/memory, foreign pods)

| measure | value | goal |
|---|---|---|
| jobs completed | {result["jobs_completed"]}/{result["jobs_submitted"]} (failed {result["jobs_failed"]}, timed out: {result["timed_out"]}) | all |
| bind-timeout re-plans | {result["bind_timeout_replans"]} (BindTimeout events: {result["bind_timeout_events"]}) | 0 |
| released pods not bound at the first try | {result["pods_not_bound_first_try"]} | 0 |
| multi-node jobs inside one rack, when a rack had room | {q["single_rack_share_when_room"]:.1%} ({q["with_room_in_one_rack"]} with room, {q["multi_node_jobs_placed"]} placed) | 100% |
| same, room still there after the jobs placed in the same round | {qa["single_rack_share_when_room"]:.1%} ({qa["with_room_in_one_rack"]} with room) | 100% |
| multi-node jobs inside one rack, all | {q["single_rack_share"]:.1%} | - |
| submit -> all bound p50 / p95 / max | {bound.get("p50", "-")} / {bound.get("p95", "-")} / {bound.get("max", "-")} s | - |
| wall time | {result["wall_seconds"]} s | - |
| gangs placed: created placed / released from the gate | {placed.get("created_placed", "-")} / {placed["all"] - placed.get("created_placed", 0) if "all" in placed else "-"} | - |

Multi-node jobs spread over racks although the poll before they were placed saw a rack
with room (the placer's own note says what its snapshot held when it decided):
{spreads}

Jobs never placed:
{never}

kube-scheduler's FailedScheduling Events (pod: note, most common first):
{failed}

Conditions:
{text}
"""


def placed_counts(text: str) -> dict[str, int]:
    """The operator's counters of gangs placed, and of those created placed (no gate)."""
    names = {"trainwave_gangs_placed_total": "all", "trainwave_gangs_placed_at_creation_total":
             "created_placed"}  # fmt: skip
    counts = dict.fromkeys(names.values(), 0)
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        if name in names:
            counts[names[name]] = int(float(value))
    return counts


def main() -> int:
    stream = make_stream(SEED, JOBS)
    load_before = round(os.getloadavg()[0], 2)
    with operator_cluster(TOPOLOGY, "bench-constraints-cluster", NAMESPACE) as bench:
        api = Api(str(bench.cluster.kubeconfig), NAMESPACE)
        nodes = prepare(api, bench, random.Random(SEED))
        print(f"{len(stream)} jobs, seed {SEED}", flush=True)
        before = placed_counts(bench.operator.metrics())
        result = run(api, stream, nodes)
        after = placed_counts(bench.operator.metrics())
        result["gangs_placed"] = {how: after[how] - before[how] for how in after}
    result["conditions"] = conditions(load_before, round(os.getloadavg()[0], 2))
    write_results(RESULTS, result, report(result))
    print(report(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
