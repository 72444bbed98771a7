"""What bench_scale (and the benchmarks built on it) measure beside the cluster's state:
the machine's load, the operator's Prometheus metrics, a process's peak RSS and CPU
seconds, the API server's audit log of the operator's requests, and a py-spy profile.
Split from bench_scale.py so its phases read on their own.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from benchmarks.operator_cluster import parse_time
from cluster.components import Layout
from cluster.controlplane import Cluster
from cluster.deploy import NAMESPACE as OPERATOR_NAMESPACE
from cluster.deploy import SERVICE_ACCOUNT

OPERATOR_USER = f"system:serviceaccount:{OPERATOR_NAMESPACE}:{SERVICE_ACCOUNT}"
PROFILE_RATE = 20  # samples/s: a few % of one core


class LoadSampler(threading.Thread):
    """os.getloadavg() every 5 s, tagged with the phase running, for the conditions."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.phase = "setup"
        self.samples: list[tuple[str, float]] = []
        self.at_start: dict[str, float] = {}

    def enter(self, phase: str) -> None:
        self.phase = phase
        self.at_start[phase] = round(os.getloadavg()[0], 2)

    def run(self) -> None:
        while True:
            self.samples.append((self.phase, os.getloadavg()[0]))
            time.sleep(5)

    def during(self, phase: str) -> dict[str, float]:
        values = [v for p, v in self.samples if p == phase]
        if not values:
            return {}
        return {
            "at_start": self.at_start.get(phase, values[0]),
            "mean": round(statistics.fmean(values), 2),
            "max": round(max(values), 2),
        }


# --- the operator's metrics -------------------------------------------------------------


def parse_metrics(text: str) -> dict[str, float]:
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            try:
                values[name] = float(value)
            except ValueError:
                continue
    return values


def delta(before: dict[str, float], after: dict[str, float], name: str) -> float:
    return after.get(name, 0.0) - before.get(name, 0.0)


def mean_ms(before: dict[str, float], after: dict[str, float], name: str) -> float | None:
    count = delta(before, after, f"{name}_count")
    return round(1000 * delta(before, after, f"{name}_sum") / count, 1) if count else None


def histogram_delta(before: dict[str, float], after: dict[str, float], name: str) -> dict[str, Any]:
    """Count, mean, and p50/p99 interpolated linearly inside the histogram's buckets."""
    buckets = []
    for key, value in after.items():
        if key.startswith(f'{name}_bucket{{le="'):
            bound = key.split('le="', 1)[1].rstrip('"}')
            buckets.append((float(bound), value - before.get(key, 0.0)))
    buckets.sort()
    count = delta(before, after, f"{name}_count")
    if not count:
        return {"count": 0}
    total = delta(before, after, f"{name}_sum")
    return {
        "count": int(count),
        "mean_ms": round(1000 * total / count, 1),
        "p50_ms": bucket_quantile(buckets, 0.5),
        "p99_ms": bucket_quantile(buckets, 0.99),
        # Quantiles that fell past the last finite bucket: their value is only a lower bound.
        "lower_bounds": [
            name
            for name, q in (("p50_ms", 0.5), ("p99_ms", 0.99))
            if len(buckets) > 1 and buckets[-2][1] < q * buckets[-1][1]
        ],
        "source": "from histogram buckets (linear interpolation inside a bucket)",
        "buckets": {str(b): int(c) for b, c in buckets},
    }


def bucket_quantile(buckets: list[tuple[float, float]], q: float) -> float | None:
    """Prometheus' histogram_quantile on cumulative buckets, in ms."""
    total = buckets[-1][1]
    rank = q * total
    lower, below = 0.0, 0.0
    for bound, cumulative in buckets:
        if cumulative >= rank:
            if bound == float("inf"):
                return round(1000 * lower, 1)  # past the last finite bucket: a lower bound
            inside = cumulative - below
            share = (rank - below) / inside if inside else 1.0
            return round(1000 * (lower + (bound - lower) * share), 1)
        lower, below = bound, cumulative
    return None


# --- the operator's process and requests -------------------------------------------------


def vm_hwm_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return None


def component_cpu(cluster: Cluster, operator_pid: int | None = None) -> dict[str, float]:
    """CPU seconds (user + system) each control-plane process and the operator used so far:
    two readings around a phase say which process the machine's 2 cores went to."""
    state = json.loads(Layout(cluster.state_dir).state_file.read_text())
    pids = {p["name"]: p["pid"] for p in state["processes"]}
    if operator_pid is not None:
        pids["operator"] = operator_pid
    return {
        name: seconds
        for name, pid in pids.items()
        if (seconds := process_cpu_seconds(pid)) is not None
    }


def cpu_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    spent = {name: round(after[name] - before.get(name, 0.0), 1) for name in after}
    return spent | {"total": round(sum(spent.values()), 1)}


class QuietGate:
    """Holds each phase back until the control plane is as idle as it gets, so that no phase
    pays for the one before it. After phase A, deleting 2,000 jobs left the garbage collector
    their Services and EndpointSlices to delete while phase B ran: at 4,096 nodes the bare
    pods took 145 s after phase A and 124 s on the same cluster quiet.

    `cpu_seconds()` is the CPU the control plane used so far (every process in the cluster's
    state: `cluster_cpu_seconds`), read over windows of `window` seconds. An idle cluster
    still renews leases and writes node heartbeats in waves (0.1-0.9 cores a window at 4,096
    nodes), so quiet is two windows in a row within `margin` cores of the lowest window seen
    in the whole run; after `timeout` the phase starts anyway, and the record says so."""

    def __init__(
        self,
        cpu_seconds: Callable[[], float],
        *,
        window: float = 10.0,
        margin: float = 0.35,
        timeout: float = 240.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.cpu_seconds, self.sleep = cpu_seconds, sleep
        self.window, self.margin, self.timeout = window, margin, timeout
        self.floor: float | None = None

    def wait(self) -> dict[str, Any]:
        cores: list[float] = []
        quiet = False
        while not quiet and len(cores) * self.window < self.timeout:
            before = self.cpu_seconds()
            self.sleep(self.window)
            cores.append(round((self.cpu_seconds() - before) / self.window, 2))
            self.floor = min(cores[-1], cores[-1] if self.floor is None else self.floor)
            quiet = len(cores) >= 2 and max(cores[-2:]) <= self.floor + self.margin
        return {
            "seconds": len(cores) * self.window,
            "quiet": quiet,
            "cores_per_window": cores,
            "floor_cores": self.floor,
        }


MACHINE_MIB = 128  # what machine_seconds hashes by default


def machine_seconds(mib: int = MACHINE_MIB, repeats: int = 3) -> float:
    """Seconds one core takes to hash `mib` MiB (the median of `repeats`): how fast this VM
    is right now. Work that cost 220 CPU-seconds in one phase cost 285 in the same phase
    twenty minutes later on this machine; taken before each phase, this says whether the
    phases of one run had the same machine."""
    block = bytes(mib << 20)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        hashlib.sha256(block).digest()
        times.append(time.perf_counter() - started)
    return round(statistics.median(times), 3)


def cluster_cpu_seconds(cluster: Cluster) -> Callable[[], float]:
    """The CPU seconds every process of `cluster` used so far, read at each call."""
    return lambda: sum(component_cpu(cluster).values())


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process (the operator, a control-plane part) since it
    started."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    return round((int(fields[11]) + int(fields[12])) / ticks, 1)


def audit_events(audit_log: Path, offset: int, since: float, until: float) -> Iterator[Any]:
    """The audit log's events after `offset` whose request was received in [since, until]."""
    if not audit_log.exists():
        return
    with audit_log.open() as log:
        log.seek(offset)
        for line in log:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if since <= parse_time(event["requestReceivedTimestamp"]) <= until:
                yield event


def request_kind(event: Any) -> str:
    """One audit event as `verb resource[/subresource]`."""
    ref = event.get("objectRef", {})
    resource = ref.get("resource", event.get("requestURI", "?"))
    if ref.get("subresource"):
        resource += "/" + ref["subresource"]
    return f"{event['verb']} {resource}"


def count_requests(audit_log: Path, offset: int, since: float, until: float) -> dict[str, Any]:
    """The operator's non-watch requests received in [since, until], from the audit log,
    by verb and resource (subresource after a slash)."""
    kinds: Counter[str] = Counter()
    watches = 0
    for event in audit_events(audit_log, offset, since, until):
        if event.get("user", {}).get("username") != OPERATOR_USER:
            continue
        if event["verb"] == "watch":
            watches += 1
        else:
            kinds[request_kind(event)] += 1
    return {
        "total": sum(kinds.values()),
        "by_verb_and_resource": dict(kinds.most_common()),
        "watches_started": watches,
        "window_seconds": round(until - since, 1),
        "source": f"kube-apiserver audit log, level Metadata, user {OPERATOR_USER} only",
    }


def writes_by_client(audit_log: Path, offset: int, since: float, until: float) -> dict[str, Any]:
    """Every client's writes (not get, list or watch) received in [since, until], by user and
    then by verb and resource: what the API server was asked to do in a phase."""
    users: dict[str, Counter[str]] = {}
    for event in audit_events(audit_log, offset, since, until):
        if event.get("verb") not in ("get", "list", "watch"):
            user = event.get("user", {}).get("username", "?")
            users.setdefault(user, Counter())[request_kind(event)] += 1
    ranked = sorted(users.items(), key=lambda item: -sum(item[1].values()))
    return {
        "total": sum(sum(c.values()) for c in users.values()),
        "by_client": {
            user: {"total": sum(c.values()), **dict(c.most_common())} for user, c in ranked
        },
    }


class Profiler:
    """py-spy sampling the running operator: only the thread holding the GIL, so samples are
    Python CPU time, not threads waiting on a socket."""

    def __init__(self, pid: int, output: Path) -> None:
        self.output = output
        binary = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        self.process: subprocess.Popen[bytes] | None = None
        if not os.access(binary, os.X_OK):
            return
        self.process = subprocess.Popen(
            [binary, "record", "--pid", str(pid), "--rate", str(PROFILE_RATE), "--nonblocking",
             "--gil", "--format", "raw", "--output", str(output)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip

    def stop(self) -> dict[str, Any] | None:
        if self.process is None:
            return None
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
        return summarize_profile(self.output)


# Frames on (nearly) every stack: the event loop, threads, the entry point. Left out of the
# report's cumulative table (kept in the JSON).
PLUMBING = ("asyncio/", "runpy>", "threading.py", "concurrent/futures/", "trainwave/cli/")


def summarize_profile(path: Path, top: int = 40) -> dict[str, Any] | None:
    """From py-spy's collapsed stacks: the functions with the most samples anywhere on the
    stack (cumulative) and at its top (self), as shares of all samples (GIL held)."""
    if not path.exists():
        return None
    cumulative: Counter[str] = Counter()
    own: Counter[str] = Counter()
    samples = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        samples += count
        # "function (file.py:123)": one entry per function, whatever the line.
        frames = [re.sub(r":\d+\)$", ")", f) for f in stack.split(";")]
        for frame in set(frames):
            cumulative[frame] += count
        own[frames[-1]] += count
    if not samples:
        return {"samples": 0}

    def share(counter: Counter[str]) -> list[list[Any]]:
        return [[frame, round(n / samples, 3)] for frame, n in counter.most_common(top)]

    return {
        "samples": samples,
        "rate_per_second": PROFILE_RATE,
        "top_cumulative": share(cumulative),
        "top_self": share(own),
        "raw": str(path),
    }
