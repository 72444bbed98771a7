"""Model-based simulation, not GPU timings: K training jobs sharing one GPU's memory.

Three ways to share one GPU of memory M between K identical jobs:
- temporal: the whole GPU time-sliced; a turn is as many whole iterations as
  fit in a time slice (at least one), and each turn swaps the previous job's
  weights and optimizer state out to the host and the next job's in (a full
  context swap, out then in). A job needs its whole footprint F <= M.
- spatial: a static split, M/K per job, all resident at once and sharing the
  compute; a job whose F > M/K cannot run in its slot and fails.
- flow: M/K per job as a budget; the submodel partitioner cuts the job into the
  fewest groups that fit the budget, and each iteration streams them as the
  executor does (forward group by group, backward in reverse with
  recomputation, optimizer step per resident group). A job that fits its
  budget whole runs unpartitioned, as in spatial. A job fails only if one
  unit (a transformer block, the LM head) alone exceeds M/K.

Per-group sizes are the partitioner's (operator/trainwave/runtime/submodel/
partition.py), measured by its dry run on the meta device: real PyTorch
modules, no memory allocated, so the numbers are what PyTorch's CPU/meta
kernels would keep (math attention with its s^2 scores; flash attention on a
GPU keeps less). Times come from stated assumptions, not from a GPU:
compute at a fixed effective FLOP/s (FLOPs: 6·N·T + 12·L·h·s·T, Kaplan et al.
2020 / PaLM App. B, plus one forward more for recomputation in flow), transfers
at a fixed host-link bandwidth each way (full duplex). A discrete-event model
serves three resources (compute, host-to-device, device-to-host) first come,
first served; each job issues its next task when the previous one ends, so one
job's transfers overlap other jobs' compute but never its own.

Run: ~/.cache/trainwave/venv-py311/bin/python tests/benchmarks/sim_shared_gpu.py
Writes tests/benchmarks/results/shared_gpu.{json,md}. About 3 minutes on 2 cores
(the dry runs dominate).
"""

from __future__ import annotations

import heapq
import json
import platform
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "operator"), str(REPO / "tests")]

import torch  # noqa: E402
from torch import nn  # noqa: E402

from benchmarks.provenance import git_commit  # noqa: E402
from trainwave.runtime.submodel.partition import Loss, PartitionError, partition  # noqa: E402

LABEL = "model-based, not GPU timings"
RESULTS = REPO / "tests" / "benchmarks" / "results"
GiB = 1 << 30


@dataclass(frozen=True)
class Assumptions:
    gpu_memory: int = 24 * GiB
    # ~40% of a 125 TFLOP/s tensor-core peak; one number for every kernel.
    effective_flops: float = 50e12
    # PCIe 4.0 x16 with pinned buffers, each direction, full duplex.
    link_bytes_per_s: float = 24e9
    iterations_per_job: int = 100
    temporal_slice_s: float = 1.0
    # The workload: a GPT-2-small-shaped transformer, fp32, AdamW.
    layers: int = 12
    hidden: int = 768
    heads: int = 12
    vocab: int = 50257
    sequence: int = 512
    optimizer_states: int = 2  # AdamW: two moments per parameter
    param_bytes: int = 4


class TokenLogits(nn.Module):
    def __init__(self, hidden: int, vocab: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(x)).flatten(0, 1)


def make_model(a: Assumptions) -> nn.Sequential:
    with torch.device("meta"):
        blocks = [
            nn.TransformerEncoderLayer(
                a.hidden, a.heads, 4 * a.hidden, dropout=0.1, batch_first=True, activation="gelu"
            )
            for _ in range(a.layers)
        ]
        return nn.Sequential(
            nn.Embedding(a.vocab, a.hidden), *blocks, TokenLogits(a.hidden, a.vocab)
        )


def unit_forward_flops(model: nn.Sequential, a: Assumptions, batch: int) -> list[float]:
    """Forward FLOPs per unit: 2·params·tokens for matmuls, plus 4·h·s·tokens
    per block for attention scores and their product with V; the embedding is
    a lookup. Backward is twice the forward."""
    tokens = batch * a.sequence
    flops = []
    for unit in model.children():
        params = sum(p.numel() for p in unit.parameters())
        if isinstance(unit, nn.Embedding):
            flops.append(0.0)
        elif isinstance(unit, nn.TransformerEncoderLayer):
            flops.append(2.0 * params * tokens + 4.0 * a.hidden * a.sequence * tokens)
        else:
            flops.append(2.0 * params * tokens)
    return flops


@dataclass(frozen=True)
class GroupCost:
    peak: int
    weights: int  # bytes of parameters
    state: int  # bytes of optimizer state
    input: int  # bytes of the group's input activation
    output: int
    forward_flops: float


@dataclass(frozen=True)
class JobShape:
    batch: int
    footprint: int  # the whole job as one group (its peak unpartitioned)
    context: int  # weights + optimizer state: what a temporal swap moves each way
    groups: tuple[GroupCost, ...] | None  # None: a unit alone exceeds the budget
    forward_flops: float


def plan_job(
    model: nn.Sequential, a: Assumptions, batch: int, budget: int | None
) -> tuple[GroupCost, ...] | None:
    with torch.device("meta"):
        x = torch.empty(batch, a.sequence, dtype=torch.long)
        y = torch.empty(batch * a.sequence, dtype=torch.long)
    loss = Loss(nn.functional.cross_entropy, y)
    factory = torch.optim.AdamW
    try:
        if budget is None:
            part = partition(model, x, factory, groups=1, loss=loss)
        else:
            part = partition(model, x, factory, budget=budget, loss=loss)
    except PartitionError:
        return None
    flops = unit_forward_flops(model, a, batch)
    bounds = part.bounds()
    costs = []
    for index, group in enumerate(part.groups):
        following = part.groups[index + 1].input_bytes if index + 1 < len(part.groups) else 0
        costs.append(
            GroupCost(
                peak=group.peak,
                weights=group.param_bytes,
                state=group.param_bytes * a.optimizer_states,
                input=group.input_bytes,
                output=following,
                forward_flops=sum(flops[bounds[index][0] : bounds[index][1]]),
            )
        )
    return tuple(costs)


# --- the discrete-event model -------------------------------------------------


@dataclass(frozen=True)
class Task:
    resource: str
    seconds: float


def simulate(jobs: list[Iterator[Task]]) -> list[float]:
    """Each job issues tasks one after another; each resource serves one task
    at a time, first come first served. Returns each job's finish time."""
    free_at: dict[str, float] = {}
    finish = [0.0] * len(jobs)
    ready = [(0.0, index) for index in range(len(jobs))]
    heapq.heapify(ready)
    while ready:
        now, index = heapq.heappop(ready)
        task = next(jobs[index], None)
        if task is None:
            finish[index] = now
            continue
        start = max(now, free_at.get(task.resource, 0.0))
        end = start + task.seconds
        free_at[task.resource] = end
        heapq.heappush(ready, (end, index))
    return finish


def temporal_tasks(job: JobShape, a: Assumptions, k: int) -> Iterator[Task]:
    iteration = 3 * job.forward_flops / a.effective_flops
    per_turn = max(1, int(a.temporal_slice_s // iteration))
    # One exclusive "gpu" resource: swap out the previous job, swap in this
    # one, run a slice, while the others wait. Alone, nothing is swapped.
    swap = 2 * job.context / a.link_bytes_per_s if k > 1 else 0.0
    left = a.iterations_per_job
    while left > 0:
        turn = min(per_turn, left)
        yield Task("gpu", swap + turn * iteration)
        left -= turn


def spatial_tasks(job: JobShape, a: Assumptions) -> Iterator[Task]:
    compute = 3 * job.forward_flops / a.effective_flops
    for _ in range(a.iterations_per_job):
        yield Task("compute", compute)


def flow_tasks(job: JobShape, a: Assumptions) -> Iterator[Task]:
    groups = job.groups
    assert groups is not None
    if len(groups) == 1:  # fits its budget whole: nothing to stream
        yield from spatial_tasks(job, a)
        return
    bandwidth, flops = a.link_bytes_per_s, a.effective_flops
    for _ in range(a.iterations_per_job):
        for group in groups[:-1]:  # forward without autograd
            yield Task("h2d", (group.weights + group.input) / bandwidth)
            yield Task("compute", group.forward_flops / flops)
            yield Task("d2h", group.output / bandwidth)
        for index in reversed(range(len(groups))):
            group = groups[index]
            yield Task("h2d", (group.weights + group.state + group.input) / bandwidth)
            # Recomputed forward + backward (2x forward); the last group's one
            # forward happens here, not in the pass above.
            yield Task("compute", 3 * group.forward_flops / flops)
            yield Task("d2h", (group.weights + group.state) / bandwidth)


def run_policy(policy: str, job: JobShape, a: Assumptions, k: int) -> dict[str, object]:
    budget = a.gpu_memory // k
    if policy == "temporal":
        runnable = k if job.footprint <= a.gpu_memory else 0
        tasks = [temporal_tasks(job, a, k) for _ in range(runnable)]
    elif policy == "spatial":
        runnable = k if job.footprint <= budget else 0
        tasks = [spatial_tasks(job, a) for _ in range(runnable)]
    else:
        runnable = k if job.groups is not None else 0
        tasks = [flow_tasks(job, a) for _ in range(runnable)]
    finish = simulate(tasks) if tasks else []
    makespan = max(finish, default=0.0)
    done = a.iterations_per_job * runnable
    return {
        "policy": policy,
        "jobs": k,
        "batch": job.batch,
        "budget_gib": round(budget / GiB, 2),
        "footprint_gib": round(job.footprint / GiB, 2),
        "groups": len(job.groups) if policy == "flow" and job.groups else (1 if runnable else 0),
        "failed_jobs": k - runnable,
        "throughput_samples_per_s": round(done * job.batch / makespan, 1) if makespan else 0.0,
        "mean_jct_s": round(sum(finish) / len(finish), 2) if finish else None,
    }


def flow_bytes_per_iteration(groups: tuple[GroupCost, ...]) -> tuple[int, int]:
    """Host-to-device and device-to-host bytes flow_tasks moves per iteration."""
    h2d = sum(g.weights + g.input for g in groups[:-1])
    h2d += sum(g.weights + g.state + g.input for g in groups)
    d2h = sum(g.output for g in groups[:-1]) + sum(g.weights + g.state for g in groups)
    return h2d, d2h


def check_traffic_model() -> dict[str, object]:
    """The transfer volumes the model charges, against the bytes the real
    executor moves in a steady-state step (a small transformer on the CPU)."""
    from benchmarks.sim_check import small_transformer_traffic

    return small_transformer_traffic(flow_bytes_per_iteration, GroupCost)


def main() -> None:
    a = Assumptions()
    check = check_traffic_model()
    print(LABEL, "traffic check", check, flush=True)
    model = make_model(a)
    batches, ks = (2, 4, 8, 16), (1, 2, 4, 8)
    started = time.monotonic()
    rows = []
    for batch in batches:
        whole = plan_job(model, a, batch, None)
        assert whole is not None
        footprint = whole[0].peak
        context = whole[0].weights + whole[0].state
        flops = sum(unit_forward_flops(model, a, batch))
        for k in ks:
            budget = a.gpu_memory // k
            groups = whole if footprint <= budget else plan_job(model, a, batch, budget)
            job = JobShape(
                batch=batch,
                footprint=footprint,
                context=context,
                groups=groups,
                forward_flops=flops,
            )
            for policy in ("temporal", "spatial", "flow"):
                rows.append(run_policy(policy, job, a, k))
                print(LABEL, rows[-1], flush=True)
    result = {
        "label": LABEL,
        "benchmark": "sim_shared_gpu",
        "git_commit": git_commit(),
        "date": time.strftime("%Y-%m-%d"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "seconds": round(time.monotonic() - started, 1),
        "assumptions": asdict(a),
        "traffic_check": check,
        "rows": rows,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "shared_gpu.json").write_text(json.dumps(result, indent=2) + "\n")
    (RESULTS / "shared_gpu.md").write_text(render_markdown(result))


def render_markdown(result: dict[str, object]) -> str:
    a = result["assumptions"]
    assert isinstance(a, dict)
    lines = [
        f"# K jobs sharing one GPU's memory ({LABEL})",
        "",
        f"Commit {result['git_commit']}, {result['date']}, torch {result['torch']}. Assumptions: "
        f"GPU memory {a['gpu_memory'] / GiB:.0f} GiB, {a['effective_flops'] / 1e12:.0f} TFLOP/s "
        f"effective, host link {a['link_bytes_per_s'] / 1e9:.0f} GB/s each way; each job a "
        f"GPT-2-small-shaped model ({a['layers']} layers, h={a['hidden']}, vocab {a['vocab']}), "
        f"sequence {a['sequence']}, fp32 AdamW, {a['iterations_per_job']} iterations; all jobs "
        f"start together; temporal slice {a['temporal_slice_s']} s. Group sizes from the "
        "partitioner's dry run on the meta device.",
        "",
        f"Transfer model check: per step the executor moved {result['traffic_check']['executor']} B "
        f"(to device, to host) on a small CPU transformer in 3 groups; the model charges "
        f"{result['traffic_check']['model']} B for the same groups.",
        "",
        "| batch | footprint GiB | K | budget GiB | policy | groups | failed jobs | samples/s | mean JCT s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    rows = result["rows"]
    assert isinstance(rows, list)
    for r in rows:
        jct = "-" if r["mean_jct_s"] is None else f"{r['mean_jct_s']:.1f}"
        lines.append(
            f"| {r['batch']} | {r['footprint_gib']} | {r['jobs']} | {r['budget_gib']} | {r['policy']} "
            f"| {r['groups']} | {r['failed_jobs']} | {r['throughput_samples_per_s']} | {jct} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
