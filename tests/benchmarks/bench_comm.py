"""Benchmark: gradient communication strategies across two emulated nodes.

Two network namespaces are the two "nodes", joined by one veth pair whose ends
are rate-limited with `tc ... tbf` (egress on both ends: a full-duplex link).
Each node runs 2 ranks (gloo, CPU); ranks on one node talk over that namespace's
loopback, so the veth counters count exactly the bytes that crossed nodes.
This kernel has no netem, so the link has a rate but no added latency.

Per link rate, tests/benchmarks/comm_worker.py trains the same model through
trainwave's `Accelerator` with each strategy (flat allreduce, hierarchical,
fp16, hierarchical+fp16, PowerSGD rank 1, and flat/hierarchical with 4-step
accumulation) and records step time and cross-node bytes per optimizer step. It
then trains with compression=auto and hierarchical=auto (link rates measured at
the start feed the cost model, which prunes; the first steps time the
survivors) and records what `auto` chose, its trial timings and its step time
afterwards, to check `auto` against the measured best.

Goals (issue 5): hierarchical moves 1.0x the gradient size across nodes per step
(flat ring: 1.5x with 2 nodes x 2 ranks) and is >= 1.3x faster when the
inter-node link is the bottleneck.

Run as root: ~/.cache/trainwave/venv-py311/bin/python tests/benchmarks/bench_comm.py
Env: BENCH_COMM_RATES (Mbit/s, comma-separated, "0" = no limit; default
100,300,1000,3000,0), BENCH_COMM_WIDTH/LAYERS (model, default 1024 x 4 = 16 MiB
of gradients), BENCH_COMM_STEPS (timed, default 4). Writes
tests/benchmarks/results/comm.{json,md}. Namespaces are removed even on failure.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "tests")]

from benchmarks.comm_report import render_markdown, summarize  # noqa: E402
from benchmarks.provenance import git_commit  # noqa: E402

WORKER = REPO / "tests" / "benchmarks" / "comm_worker.py"
RESULTS = REPO / "tests" / "benchmarks" / "results"
RATES = [int(r) for r in os.environ.get("BENCH_COMM_RATES", "100,300,1000,3000,0").split(",")]
WIDTH = int(os.environ.get("BENCH_COMM_WIDTH", "1024"))
LAYERS = int(os.environ.get("BENCH_COMM_LAYERS", "4"))
STEPS = int(os.environ.get("BENCH_COMM_STEPS", "4"))
WARMUP, BATCH, LOCAL, NODES = 3, 32, 2, 2
SUFFIX = str(os.getpid())
NAMESPACES = [f"twbench{SUFFIX}n{i}" for i in range(NODES)]
IFACE = "twlink"  # the veth end's name inside each namespace
SUBNET = "10.213.0"


def sh(*cmd: str) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def ensure_tools() -> str:
    """`ip` and `tc`; installs Debian's iproute2 only if either is missing, and says so."""
    if os.geteuid() != 0:
        sys.exit("bench_comm needs root: it creates network namespaces and tc qdiscs")
    if shutil.which("ip") and shutil.which("tc"):
        return "present"
    subprocess.run(["apt-get", "update", "-qq"], check=True)
    subprocess.run(["apt-get", "install", "-y", "-qq", "iproute2"], check=True)
    return "installed iproute2 from Debian apt"


def create_link() -> None:
    for ns in NAMESPACES:
        sh("ip", "netns", "add", ns)
        sh("ip", "-n", ns, "link", "set", "lo", "up")
    a, b = f"twb{SUFFIX}a", f"twb{SUFFIX}b"
    sh("ip", "link", "add", a, "type", "veth", "peer", "name", b)
    for i, (ns, end) in enumerate(zip(NAMESPACES, (a, b), strict=True)):
        sh("ip", "link", "set", end, "netns", ns)
        sh("ip", "-n", ns, "link", "set", end, "name", IFACE)
        sh("ip", "-n", ns, "addr", "add", f"{SUBNET}.{i + 1}/24", "dev", IFACE)
        sh("ip", "-n", ns, "link", "set", IFACE, "up")


def set_rate(mbit: int) -> None:
    """tbf on both ends; 0 removes the limit (the veth then runs at CPU speed)."""
    for ns in NAMESPACES:
        subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", IFACE, "root"],
                       capture_output=True, check=False)  # fmt: skip
        if mbit:
            # burst >= rate/HZ or tbf cannot reach its rate; 4 ms of traffic is ample.
            burst = max(32_000, mbit * 1_000_000 // 8 // 250)
            sh("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", IFACE, "root", "tbf",
               "rate", f"{mbit}mbit", "burst", str(burst), "latency", "400ms")  # fmt: skip


def cleanup() -> None:
    # Deleting a namespace deletes the veth end inside it, and with it the pair.
    for ns in NAMESPACES:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)


def run_rate(mbit: int, port: int) -> dict:
    set_rate(mbit)
    out = Path(f"/tmp/twbench{SUFFIX}-{mbit}.json")
    out.unlink(missing_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": IFACE}
    procs, logs = [], []
    for rank in range(NODES * LOCAL):
        ns = NAMESPACES[rank // LOCAL]
        args = {"rank": rank, "world": NODES * LOCAL, "local": LOCAL, "port": port,
                "width": WIDTH, "layers": LAYERS, "batch": BATCH, "warmup": WARMUP,
                "steps": STEPS, "master": f"{SUBNET}.1", "iface": IFACE, "out": out}  # fmt: skip
        cmd = ["ip", "netns", "exec", ns, sys.executable, str(WORKER)]
        cmd += [part for k, v in args.items() for part in (f"--{k}", str(v))]
        logs.append(Path(f"/tmp/twbench{SUFFIX}-{mbit}-rank{rank}.log"))
        with logs[-1].open("w") as log:
            procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT))
    try:
        # One dead rank leaves the others waiting in a collective: stop at the first failure.
        while any(p.poll() is None for p in procs):
            failed = [r for r, p in enumerate(procs) if p.returncode not in (None, 0)]
            if failed:
                tail = logs[failed[0]].read_text()[-3000:]
                raise RuntimeError(f"rank {failed[0]} failed at {mbit} Mbit/s:\n{tail}")
            time.sleep(0.5)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    if any(p.returncode for p in procs) or not out.exists():
        tails = "\n".join(log.read_text()[-1500:] for log in logs)
        raise RuntimeError(f"workers failed at {mbit} Mbit/s:\n{tails}")
    for log in logs:
        log.unlink()
    doc = json.loads(out.read_text())
    out.unlink()
    return doc


def conditions(load_before: tuple[float, ...], tools: str) -> dict:
    import torch

    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "git_commit": git_commit(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores (shared with other work)",
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "backend": "gloo (CPU), OMP_NUM_THREADS=1 per rank",
        "layout": f"{NODES} emulated nodes (network namespaces) x {LOCAL} ranks, ranks numbered node by node",
        "link": "veth pair, tc tbf on both ends (no netem in this kernel: no added latency)",
        "model": f"{LAYERS} x Linear({WIDTH}, {WIDTH}) + ReLU, batch {BATCH} per rank, SGD",
        "steps": f"{WARMUP} warm-up + {STEPS} timed optimizer steps per strategy; median step time",
        "powersgd": "rank 1, compression from step 3 (start_iter=2), error feedback, warm start",
        "auto": "compression=auto, hierarchical=auto, trainwave.runtime.comm.trials.TrialOptions "
        "defaults (the candidates the cost model does not call hopeless, <= 5; 1 warm-up + 3 "
        "timed rounds, one step per candidate per round, PowerSGD's 4 steps back to back after "
        "them; median; lossy only if > 1.1x faster than the best exact); then the same timed "
        "steps as the others",
        "bytes": "veth tx/rx of node 0 per optimizer step; includes TCP/IP headers and ACKs",
        "iproute2": tools,
    }


def main() -> None:
    load_before = os.getloadavg()
    tools = ensure_tools()
    # A SIGTERM (a CI timeout) must still reach `finally` and remove the namespaces.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    runs = {}
    try:
        create_link()
        for i, mbit in enumerate(RATES):
            label = f"{mbit} Mbit/s" if mbit else "no limit"
            print(f"-- {label}", flush=True)
            runs[label] = run_rate(mbit, 29700 + i)
            runs[label]["rate_mbit"] = mbit
    finally:
        cleanup()
    doc = {"benchmark": "comm", "conditions": conditions(load_before, tools), "runs": runs}
    doc["summary"] = summarize(runs)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "comm.json").write_text(json.dumps(doc, indent=2) + "\n")
    (RESULTS / "comm.md").write_text(render_markdown(doc))
    print(render_markdown(doc))


if __name__ == "__main__":
    main()
