"""Benchmark: GPU-sharing packing on the Alibaba openb trace, under the FGD paper's protocol.

Reproduces the experiment of Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing
Workloads with Fragmentation Gradient Descent" (USENIX ATC'23), on the trace they published
(alibaba/clusterdata, cluster-trace-gpu-v2023), with the policies of trainwave.placement.packing
(imported, not copied). Protocol, as in the reference simulator:

- cluster: openb_node_list_gpu_node.csv (1,213 nodes, 6,212 GPUs);
- tasks: the variant's pod list sorted by name, shuffled with seed s (42..51), then tuned to
  1.3x the cluster's GPUs: random pods dropped while above; pods sampled with replacement from
  the name-sorted list and appended while below (the reference stops when one more pod's
  per-GPU milli would overshoot, and so do we);
- node names: the reference prefixes every node name with "%04d-" of a seeded permutation, so
  "smallest name" is a random but fixed node order per seed (`--node-names trace`: no prefix);
- pods arrive one at a time and never leave; one that fits nowhere fails;
- typical shapes for FGD: from the variant's whole pod list, 95% coverage, CPU-only pods in;
- metric: GPU allocation (% of cluster milli-GPU) against arrived GPU request (% of capacity),
  averaged per integer percent like the reference analysis; headline = 100 - allocation at 100%
  arrived ("unallocated GPUs"), and allocation at 130%.

The shuffles use Python's random, not Go's, so per-seed orders differ from the published runs;
means over 10 seeds are what is compared. Calibration gate: Best-fit and FGD within 0.5 points
of the published means (allocation at 100% and 130%) on the default trace.

Task shapes (`--tasks`, a comma list, each a row of the table; default `published`):
- published: the trace's pods as they are, the protocol above;
- operator: each pod as the task the operator builds from a TrainingJob asking what the pod
  asks (operator_tasks.py documents the mapping): the CPU and memory the built worker pod
  requests, memory in bytes;
- operator-cpu-blind: the same tasks, but the packer scores shared tasks (a fraction of one GPU)
  as the operator did before they carried CPU and memory: no CPU or memory on the task or the
  node, after a filter on the real CPU and memory (kube-scheduler's, via worker slots).

Run: python tests/benchmarks/fgd_trace.py [TRACE_DIR] [--variants default,...] [--seeds 42-51]
[--policies best-fit,fgd,fgd-consolidate] [--tasks published,operator] [--jobs 1]
[--node-stride 20 (quick)]. TRACE_DIR defaults to $TRAINWAVE_TRACE_DIR, else ../shared/data/openb-gpu-2023 from the repo root.
Writes tests/benchmarks/results/fgd_trace.{json,md}; exits 1 when the calibration gate fails.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "operator"), str(REPO / "tests")]

from benchmarks import operator_tasks  # noqa: E402
from trainwave.placement.fragmentation import (  # noqa: E402
    FragmentationMeasure,
    typical_shapes,
)
from trainwave.placement.packing import (  # noqa: E402
    BestFit,
    Fgd,
    FgdConsolidate,
    NodeState,
    Policy,
    Task,
    assign,
    choose,
    fits,
)

DEFAULT_TRACE_DIR = REPO.parent / "shared" / "data" / "openb-gpu-2023"
RESULTS = Path(__file__).resolve().parent / "results"
NODE_FILE = "openb_node_list_gpu_node.csv"
PUBLISHED_FILE = "published_fgd_allocation.csv"
PUBLISHED_NAMES = {"best-fit": "05-BestFit", "fgd": "06-FGD"}
TUNE = 1.3
GATE_POINTS = 0.5
GATE_VARIANT = "default"

Factory = Callable[[FragmentationMeasure], Policy]
POLICIES: dict[str, Factory] = {
    "best-fit": lambda measure: BestFit(),
    "fgd": Fgd,
    "fgd-consolidate": FgdConsolidate,
}
TASKS = ("published", "operator", "operator-cpu-blind")


@dataclass(frozen=True)
class Job:
    directory: Path
    variant: str
    policy: str
    seed: int
    names: str = "simulator"  # or "trace"
    stride: int = 1
    tasks: str = "published"  # or "operator", "operator-cpu-blind"


@dataclass(frozen=True)
class Run:
    variant: str
    policy: str
    seed: int
    unallocated_100: float
    allocated_130: float
    failed: int
    tasks: int
    seconds: float


def trace_dir(argument: str | None) -> Path:
    chosen = argument or os.environ.get("TRAINWAVE_TRACE_DIR") or str(DEFAULT_TRACE_DIR)
    return Path(chosen).resolve()


def load_nodes(directory: Path, stride: int = 1) -> list[NodeState]:
    """The cluster; `stride` > 1 keeps every stride-th node (a smaller cluster, same mix)."""
    with (directory / NODE_FILE).open(newline="") as handle:
        rows = list(csv.DictReader(handle))[::stride]
    return [
        NodeState.empty(
            r["sn"], r["model"], int(r["cpu_milli"]), int(r["memory_mib"]), int(r["gpu"])
        )
        for r in rows
    ]


def load_pods(path: Path) -> list[Task]:
    """The variant's tasks, in pod-name order."""
    with path.open(newline="") as handle:
        rows = sorted(csv.DictReader(handle), key=lambda r: r["name"])
    return [
        Task(int(r["cpu_milli"]), int(r["memory_mib"]), int(r["num_gpu"]), int(r["gpu_milli"]),
             frozenset(m for m in (r.get("gpu_spec") or "").split("|") if m))
        for r in rows
    ]  # fmt: skip


def workload(
    pods: Sequence[Task], nodes: Sequence[NodeState], seed: int, names: str, tune: float = TUNE
) -> tuple[list[Task], list[NodeState]]:
    """Arrival order for one seed, and the nodes renamed the way the reference renames them."""
    rng = random.Random(seed)
    order = list(pods)  # already sorted by name
    rng.shuffle(order)
    capacity = sum(len(n.gpu_free) for n in nodes) * 1000
    target = tune * capacity
    total = sum(p.gpu_request for p in order)
    if total > target:
        while total > target:
            total -= order.pop(rng.randrange(len(order))).gpu_request
    else:
        while True:
            extra = pods[rng.randrange(len(pods))]
            if total + extra.gpu_milli > target:  # sic: per-GPU milli, as the reference
                break
            total += extra.gpu_request
            order.append(extra)
    ordered = sorted(nodes, key=lambda n: n.name)
    if names == "simulator":
        prefix = rng.sample(range(len(ordered)), len(ordered))
        renamed = [
            NodeState(f"{p:04d}-{n.name}", n.gpu_model, n.cpu_free, n.memory_free, n.gpu_free)
            for p, n in zip(prefix, ordered, strict=True)
        ]
        return order, renamed
    return order, ordered


def simulate(
    policy: Policy, nodes: Sequence[NodeState], tasks: Sequence[Task], cpu_blind: bool = False
) -> tuple[list[tuple[int, int]], int]:
    """(arrived, allocated) milli-GPU after each task, and how many failed; none ever leave.

    `cpu_blind`: shared tasks are scored without CPU and memory (after the real filter)."""
    states = list(nodes)
    where = {n.name: i for i, n in enumerate(states)}
    arrived = allocated = failed = 0
    points = []
    for task in tasks:
        arrived += task.gpu_request
        if cpu_blind and task.shared:
            seen = [operator_tasks.cpu_blind(n) for n in states if fits(n, task)]
            choice = choose(policy, seen, operator_tasks.blind_task(task))
        else:
            choice = choose(policy, states, task)
        if choice is None:
            failed += 1
        else:
            i = where[choice.node]
            states[i] = assign(states[i], task, choice.gpus)
            allocated += task.gpu_request
        points.append((arrived, allocated))
    return points, failed


def allocation_curve(points: Sequence[tuple[int, int]], capacity: int) -> dict[int, float]:
    """Allocation % per integer arrived %, averaged as the reference analysis does."""
    buckets: dict[int, list[float]] = {}
    for arrived, allocated in points:
        buckets.setdefault(round(arrived / capacity * 100), []).append(
            round(allocated / capacity * 100, 2)
        )
    curve = {}
    for percent in range(0, 131):
        values = buckets.get(percent) or [
            v for p in (percent - 1, percent, percent + 1) for v in buckets.get(p, [])
        ]
        if values:
            curve[percent] = statistics.fmean(values)
    return curve


def run_one(job: Job) -> Run:
    started = time.perf_counter()
    nodes = load_nodes(job.directory, job.stride)
    pods = load_pods(job.directory / f"openb_pod_list_{job.variant}.csv")
    if job.tasks != "published":
        pods, nodes = operator_tasks.operator_tasks(pods), operator_tasks.in_bytes(nodes)
    measure = FragmentationMeasure(typical_shapes(p.shape for p in pods))
    tasks, named = workload(pods, nodes, job.seed, job.names)
    blind = job.tasks == "operator-cpu-blind"
    points, failed = simulate(POLICIES[job.policy](measure), named, tasks, blind)
    curve = allocation_curve(points, sum(len(n.gpu_free) for n in nodes) * 1000)
    row = job.variant if job.tasks == "published" else f"{job.variant} [{job.tasks}]"
    return Run(
        row, job.policy, job.seed, round(100 - curve.get(100, float("nan")), 3),
        round(curve.get(130, float("nan")), 3), failed, len(tasks),
        round(time.perf_counter() - started, 2),
    )  # fmt: skip


def published_means(directory: Path) -> dict[tuple[str, str], tuple[float, float]]:
    """(variant, policy) -> (mean allocation at 100%, at 130%) over the published seeds."""
    path = directory / PUBLISHED_FILE
    if not path.exists():
        return {}
    found: dict[tuple[str, str], list[tuple[float, float]]] = {}
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            variant = row["workload"].removeprefix("openb_pod_list_")
            for ours, theirs in PUBLISHED_NAMES.items():
                if row["sc_policy"] == theirs:
                    found.setdefault((variant, ours), []).append(
                        (float(row["100"]), float(row["130"]))
                    )
    return {
        key: (statistics.fmean(a for a, _ in v), statistics.fmean(b for _, b in v))
        for key, v in found.items()
    }


def summarise(runs: Sequence[Run]) -> dict[str, dict[str, dict[str, float]]]:
    """variant -> policy -> mean and sd of both metrics, over the seeds that ran."""
    table: dict[str, dict[str, dict[str, float]]] = {}
    for variant in dict.fromkeys(r.variant for r in runs):
        for policy in dict.fromkeys(r.policy for r in runs):
            chosen = [r for r in runs if r.variant == variant and r.policy == policy]
            if not chosen:
                continue
            unalloc = [r.unallocated_100 for r in chosen]
            alloc = [r.allocated_130 for r in chosen]
            entry = table.setdefault(variant, {})[policy] = {
                "seeds": len(chosen),
                "unallocated_100": round(statistics.fmean(unalloc), 2),
                "unallocated_100_sd": round(statistics.pstdev(unalloc), 2),
                "allocated_130": round(statistics.fmean(alloc), 2),
                "allocated_130_sd": round(statistics.pstdev(alloc), 2),
                "failed": round(statistics.fmean(r.failed for r in chosen), 1),
            }
            fgd = {r.seed: r for r in runs if r.variant == variant and r.policy == "fgd"}
            paired = [
                r.unallocated_100 - fgd[r.seed].unallocated_100 for r in chosen if r.seed in fgd
            ]
            if policy != "fgd" and paired:  # same seed = same arrival order: compare per seed
                entry["vs_fgd_unallocated_100"] = round(statistics.fmean(paired), 2)
                entry["vs_fgd_better_seeds"] = sum(d < 0 for d in paired)
    return table


def gate(
    table: dict[str, dict[str, dict[str, float]]],
    published: dict[tuple[str, str], tuple[float, float]],
) -> tuple[bool | None, list[str]]:
    """Calibration: ours vs published on the default trace; None when it could not be checked."""
    lines, verdicts = [], []
    for policy in PUBLISHED_NAMES:
        ours = table.get(GATE_VARIANT, {}).get(policy)
        theirs = published.get((GATE_VARIANT, policy))
        if ours is None or theirs is None:
            continue
        for metric, mine, ref in (
            ("allocation @100%", 100 - ours["unallocated_100"], theirs[0]),
            ("allocation @130%", ours["allocated_130"], theirs[1]),
        ):
            ok = abs(mine - ref) <= GATE_POINTS
            verdicts.append(ok)
            lines.append(
                f"  {policy:9s} {metric}: ours {mine:6.2f} vs published {ref:6.2f} "
                f"(diff {mine - ref:+.2f}, {int(ours['seeds'])} seeds) {'ok' if ok else 'FAIL'}"
            )
    return (all(verdicts) if verdicts else None), lines


def markdown(
    table: dict[str, dict[str, dict[str, float]]],
    published: dict[tuple[str, str], tuple[float, float]],
) -> str:
    policies = list(dict.fromkeys(p for row in table.values() for p in row))
    head = (
        "| variant | "
        + " | ".join(f"{p} unalloc@100 | {p} alloc@130" for p in policies)
        + " | published BestFit / FGD unalloc@100 | fgd-consolidate - FGD, paired (seeds better) |"
    )
    lines = [head, "|---" * (2 * len(policies) + 3) + "|"]
    for variant, row in table.items():
        cells = []
        for p in policies:
            m = row.get(p)
            cells += (
                [f"{m['unallocated_100']:.2f} ± {m['unallocated_100_sd']:.2f}", f"{m['allocated_130']:.2f}"]
                if m else ["", ""]
            )  # fmt: skip
        refs = [published.get((variant, p)) for p in PUBLISHED_NAMES]
        ref = " / ".join("-" if r is None else f"{100 - r[0]:.2f}" for r in refs)
        ours = row.get("fgd-consolidate", {})
        paired = (
            f"{ours['vs_fgd_unallocated_100']:+.2f} ({ours['vs_fgd_better_seeds']}/{ours['seeds']})"
            if "vs_fgd_unallocated_100" in ours else "-"
        )  # fmt: skip
        lines.append(f"| {variant} | " + " | ".join(cells) + f" | {ref} | {paired} |")
    return "\n".join(lines) + "\n"


def parse_seeds(text: str) -> list[int]:
    seeds: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        seeds += range(int(low), int(high or low) + 1)
    return seeds


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("trace_dir", nargs="?", help="trace directory (see module docstring)")
    parser.add_argument("--variants", help="comma list; default: every pod list present")
    parser.add_argument("--seeds", default="42-51", help="e.g. 42-51 or 42,45 (default 42-51)")
    parser.add_argument("--policies", default=",".join(POLICIES), help="comma list")
    parser.add_argument("--tasks", default="published", help=f"comma list of {', '.join(TASKS)}")
    parser.add_argument("--node-names", choices=("simulator", "trace"), default="simulator")
    parser.add_argument("--node-stride", type=int, default=1, help="every N-th node (quick runs)")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    parser.add_argument("--output", type=Path, default=RESULTS / "fgd_trace.json")
    args = parser.parse_args(argv)

    directory = trace_dir(args.trace_dir)
    if not (directory / NODE_FILE).exists():
        parser.error(
            f"no {NODE_FILE} in {directory}: pass the trace directory or set TRAINWAVE_TRACE_DIR"
        )
    present = sorted(
        p.stem.removeprefix("openb_pod_list_") for p in directory.glob("openb_pod_list_*.csv")
    )
    variants = args.variants.split(",") if args.variants else present
    policies = args.policies.split(",")
    shapes = args.tasks.split(",")
    checks = ((variants, present, "variant"), (policies, list(POLICIES), "policy"),
              (shapes, list(TASKS), "tasks"))  # fmt: skip
    for name, known, what in checks:
        unknown = sorted(set(name) - set(known))
        if unknown:
            parser.error(f"unknown {what} {unknown}; available: {', '.join(known)}")
    # Best-fit never ran in the operator: the CPU-blind ablation is only for the FGD policies.
    jobs = [Job(directory, v, p, s, args.node_names, args.node_stride, t) for t in shapes
            for v in variants for p in policies for s in parse_seeds(args.seeds)
            if not (t == "operator-cpu-blind" and p == "best-fit")]  # fmt: skip

    started, load_before = time.perf_counter(), os.getloadavg()
    if args.jobs > 1:
        with ProcessPoolExecutor(max_workers=args.jobs) as pool:
            runs = list(pool.map(run_one, jobs))
    else:
        runs = [run_one(job) for job in jobs]
    wall = time.perf_counter() - started

    published = published_means(directory)
    table = summarise(runs)
    passed, gate_lines = gate(table, published) if args.node_stride == 1 else (None, [])
    report = markdown(table, published)
    print("Calibration gate (default trace, within ±0.5 points of the published means):")
    print(
        "\n".join(gate_lines)
        if gate_lines
        else "  not checked: needs variant default and best-fit/fgd"
    )
    print(f"\n{report}\n{len(runs)} runs in {wall:.0f} s wall ({args.jobs} process(es))")

    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({
        "benchmark": "FGD protocol (Weng et al., ATC'23) on alibaba/clusterdata openb trace",
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "trace_dir": str(directory),
        "conditions": {"python": platform.python_version(), "machine": platform.machine(),
                       "cpus": os.cpu_count(), "jobs": args.jobs, "node_names": args.node_names,
                       "tune": TUNE, "seeds": parse_seeds(args.seeds), "tasks": shapes,
                       "load_1_5_15_min": {"before": load_before, "after": os.getloadavg()}},
        "wall_seconds": round(wall, 1),
        "gate": {"passed": passed, "lines": gate_lines},
        "summary": table,
        "published": {f"{v}/{p}": {"allocated_100": round(a, 2), "allocated_130": round(b, 2)}
                      for (v, p), (a, b) in sorted(published.items())},
        "runs": [r.__dict__ for r in runs],
    }, indent=1) + "\n")  # fmt: skip
    args.output.with_suffix(".md").write_text(report)
    return 1 if passed is False else 0


if __name__ == "__main__":
    sys.exit(main())
