"""Benchmark: PyTorch's DataLoader defaults vs the runtime's loader defaults, I/O-bound data.

The dataset is EMULATED storage: each item is a file on local disk, and every
read first sleeps a fixed latency (time.sleep, default 5 ms), standing in for
a network filesystem or object store. The sleep releases the GIL and uses no
CPU, like a real storage wait. Numbers therefore depend on that latency: with
faster storage or decoding-bound data the gain is smaller. Each batch then
feeds one real training step of a small MLP (forward, backward, SGD) in the
main process, with torch limited to 1 thread.

Compared in one run, interleaved per repeat so machine noise hits all alike:
- plain:   DataLoader(ds, batch_size, shuffle=True), PyTorch's defaults
           (in-process loading, num_workers=0);
- workers: the runtime's defaults without concurrent fetching (fetch_threads=1),
           to show what the worker processes alone give;
- runtime: the runtime's defaults as a worker gets them from the launcher
           (`resolve_loader_defaults` on this machine's CPU quota).
Throughput = samples / wall time for EPOCHS epochs, worker start-up included.

Goal (issue 5): runtime >= 2.5x plain samples/s.

Run: ~/.cache/trainwave/venv-py311/bin/python tests/benchmarks/bench_loader.py
Env: BENCH_LOADER_LATENCY_MS (5), BENCH_LOADER_ITEMS (1024), BENCH_LOADER_BATCH (32),
     BENCH_LOADER_EPOCHS (2), BENCH_LOADER_REPEATS (3).
Writes tests/benchmarks/results/loader.{json,md}. About 2 minutes on 2 cores.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "operator"), str(REPO / "tests")]

import torch  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

from benchmarks.provenance import git_commit  # noqa: E402
from trainwave.runtime.data.loader_defaults import (  # noqa: E402
    LoaderDefaults,
    cpu_quota,
    resolve_loader_defaults,
)
from trainwave.runtime.data.prefetch import build_loader  # noqa: E402
from trainwave.runtime.settings import load_settings  # noqa: E402

LATENCY_MS = float(os.environ.get("BENCH_LOADER_LATENCY_MS", "5"))
ITEMS = int(os.environ.get("BENCH_LOADER_ITEMS", "1024"))
BATCH = int(os.environ.get("BENCH_LOADER_BATCH", "32"))
EPOCHS = int(os.environ.get("BENCH_LOADER_EPOCHS", "2"))
REPEATS = int(os.environ.get("BENCH_LOADER_REPEATS", "3"))
FEATURES = 4096  # float32 values per item: a 16 KiB file
RESULTS = REPO / "tests" / "benchmarks" / "results"


class EmulatedStorage(Dataset[tuple[torch.Tensor, int]]):
    """Items are files; each read waits LATENCY_MS first (emulated storage latency)."""

    def __init__(self, directory: Path, count: int, latency_s: float) -> None:
        self.directory, self.count, self.latency_s = directory, count, latency_s

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        time.sleep(self.latency_s)
        raw = (self.directory / f"{index:06d}.bin").read_bytes()
        values = torch.frombuffer(bytearray(raw), dtype=torch.float32)
        return (values - values.mean()) / (values.std() + 1e-6), index % 10


def write_items(directory: Path) -> None:
    generator = torch.Generator().manual_seed(0)
    for index in range(ITEMS):
        item = torch.randn(FEATURES, generator=generator)
        (directory / f"{index:06d}.bin").write_bytes(bytes(item.view(torch.uint8).tolist()))


def train(loader: DataLoader[Any]) -> tuple[float, float]:
    """Samples/s over EPOCHS epochs, and the mean time of the training step alone."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(FEATURES, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    samples, step_time = 0, 0.0
    started = time.perf_counter()
    for _ in range(EPOCHS):
        for features, labels in loader:
            step_started = time.perf_counter()
            loss = torch.nn.functional.cross_entropy(model(features), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step_time += time.perf_counter() - step_started
            samples += len(labels)
    elapsed = time.perf_counter() - started
    steps = EPOCHS * -(-ITEMS // BATCH)
    return samples / elapsed, step_time / steps


def loaders(dataset: EmulatedStorage, runtime: LoaderDefaults) -> dict[str, DataLoader[Any]]:
    workers_only = dataclasses.replace(runtime, fetch_threads=1)
    return {
        "plain": DataLoader(dataset, batch_size=BATCH, shuffle=True),
        "workers": build_loader(dataset, workers_only, batch_size=BATCH, shuffle=True),
        "runtime": build_loader(dataset, runtime, batch_size=BATCH, shuffle=True),
    }


def run() -> dict[str, Any]:
    torch.set_num_threads(1)
    runtime = resolve_loader_defaults(load_settings(os.environ))
    load_before = os.getloadavg()[0]
    rates: dict[str, list[float]] = {"plain": [], "workers": [], "runtime": []}
    steps: dict[str, list[float]] = {"plain": [], "workers": [], "runtime": []}
    with tempfile.TemporaryDirectory(prefix="bench-loader-") as scratch:
        directory = Path(scratch)
        write_items(directory)
        dataset = EmulatedStorage(directory, ITEMS, LATENCY_MS / 1000)
        for repeat in range(REPEATS):
            for name, loader in loaders(dataset, runtime).items():
                rate, step = train(loader)
                rates[name].append(rate)
                steps[name].append(step)
                print(
                    f"repeat {repeat}: {name:8s} {rate:7.1f} samples/s (step {step * 1e3:.1f} ms)",
                    flush=True,
                )
                del loader
    median = {name: statistics.median(values) for name, values in rates.items()}
    return {
        "samples_per_second": {
            name: {"median": round(median[name], 1), "runs": [round(v, 1) for v in values]}
            for name, values in rates.items()
        },
        "speedup_vs_plain": {name: round(median[name] / median["plain"], 2) for name in ("workers", "runtime")},
        "train_step_ms_median": {name: round(statistics.median(v) * 1e3, 2) for name, v in steps.items()},
        "loaders": {
            "plain": "DataLoader(ds, batch_size, shuffle=True): num_workers=0, pin_memory=False",
            "workers": {**dataclasses.asdict(runtime), "fetch_threads": 1},
            "runtime": dataclasses.asdict(runtime),
        },
        "conditions": {
            "dataset": f"{ITEMS} items, each a {FEATURES * 4 // 1024} KiB file on local disk read after "
                       f"an EMULATED storage latency of {LATENCY_MS:g} ms (time.sleep)",
            "step": f"MLP {FEATURES}-256-10 forward/backward/SGD in the main process, torch threads 1",
            "batch": BATCH,
            "epochs_per_run": EPOCHS,
            "repeats": REPEATS,
            "order": "plain, workers, runtime interleaved within each repeat; median reported",
            "cpu_quota": cpu_quota(),
            "machine": f"{os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()}, "
                       f"torch {torch.__version__}",
            "load_average_1m_before": round(load_before, 2),
            "date": time.strftime("%Y-%m-%d"),
            "commit": git_commit(),
        },
    }  # fmt: skip


def markdown(results: dict[str, Any]) -> str:
    rates, conditions = results["samples_per_second"], results["conditions"]
    lines = [
        "| loader | samples/s (median) | runs | speedup vs plain | train step (ms) |",
        "|---|---|---|---|---|",
    ]
    for name in ("plain", "workers", "runtime"):
        speedup = results["speedup_vs_plain"].get(name, 1.0)
        runs = ", ".join(f"{v:g}" for v in rates[name]["runs"])
        step = results["train_step_ms_median"][name]
        lines.append(f"| {name} | {rates[name]['median']:g} | {runs} | {speedup:g}x | {step:g} |")
    lines.append("")
    lines.extend(f"- {key}: {value}" for key, value in conditions.items())
    lines.append(f"- runtime loader: {results['loaders']['runtime']}")
    return "\n".join(lines) + "\n"


def main() -> int:
    results = run()
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "loader.json").write_text(json.dumps(results, indent=2) + "\n")
    (RESULTS / "loader.md").write_text(markdown(results))
    print(markdown(results))
    speedup = results["speedup_vs_plain"]["runtime"]
    print(f"goal runtime >= 2.5x plain: {'met' if speedup >= 2.5 else 'MISSED'} ({speedup}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
