"""Faults for bench_faults.py, injected from the host, and a watch on the job's status.

The real node's containers run in this machine's pid namespace, so a training process
is found through /proc like any other: its command line runs fault_worker.py (and is
neither the elastic agent, `torch.distributed.run`, nor trainwave's launcher) and its
environment names the job and the global rank torchrun gave it. A warm-started process
(the runtime's default with in-place restarts) keeps its forkserver's command line and
environment, and names its rank in a file instead (training_processes below). The `slow` fault needs
cgroup v1's cpu controller (this machine's; a v2 host would write cpu.max instead). The
`drain` fault is what `kubectl drain` does to one worker's pod: an Eviction through the API.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

from kubernetes import client, config

from trainwave import contract
from trainwave.runtime.reports import IDENTITY_DIR

SCRIPT = "fault_worker.py"
FORKSERVER = "multiprocessing.forkserver"  # the command line every warm-started process keeps
NOT_TRAINING = ("torch.distributed.run", "trainwave.runtime.launch")


def training_processes(
    namespace: str, job: str, rank: int, proc: Path = Path("/proc")
) -> list[int]:
    """Pids of the live training processes of `job` with global rank `rank`: started by
    torchrun (their command line and environment say so), or warm-started, forked from
    the agent's forkserver (its command line, its environment, and the rank in the file
    the process wrote under its report directory: runtime/launcher/warm_child.py)."""
    wanted = {f"{contract.ENV_JOB_NAMESPACE}={namespace}", f"{contract.ENV_JOB_NAME}={job}"}
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            command = b" ".join(argv).decode(errors="replace")
            environment = set((entry / "environ").read_bytes().decode(errors="replace").split("\0"))
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:  # gone while we looked
            continue
        if not wanted <= environment or state in ("Z", "X"):
            continue
        if FORKSERVER in command:
            training = warm_rank(entry, environment) == rank
        else:
            training = (
                SCRIPT in command
                and not any(marker in command for marker in NOT_TRAINING)
                and f"RANK={rank}" in environment
            )
        if training:
            found.append(int(entry.name))
    return found


def warm_rank(entry: Path, environment: set[str]) -> int | None:
    """The rank a forked process wrote, read through its own root (a container's files)
    under the pid its own namespace gives it; None for the server itself."""
    prefix = f"{contract.ENV_REPORT_DIR}="
    report_dir = next((e[len(prefix) :] for e in environment if e.startswith(prefix)), None)
    if report_dir is None:
        return None
    try:
        status = (entry / "status").read_text()
        own_pid = next(
            line.split()[-1] for line in status.splitlines() if line.startswith("NSpid:")
        )
        path = entry / "root" / report_dir.lstrip("/") / IDENTITY_DIR / f"{own_pid}.json"
        rank = json.loads(path.read_text()).get("rank")
        return None if rank is None else int(rank)
    except (OSError, StopIteration, ValueError):
        return None


def worker_pod(kubeconfig: Path, namespace: str, job: str, worker: int) -> client.V1Pod:
    """The one running pod of `worker` (its index, label LABEL_RANK)."""
    core = client.CoreV1Api(config.new_client_from_config(config_file=str(kubeconfig)))
    selector = f"{contract.LABEL_JOB_NAME}={job},{contract.LABEL_RANK}={worker}"
    pods = core.list_namespaced_pod(namespace, label_selector=selector).items
    live = [
        p for p in pods if p.metadata.deletion_timestamp is None and p.status.phase == "Running"
    ]
    if len(live) != 1:
        names = [p.metadata.name for p in pods]
        raise RuntimeError(f"worker {worker} of {namespace}/{job}: expected one running pod, "
                           f"found {names}")  # fmt: skip
    pod: client.V1Pod = live[0]
    return pod


def evict_worker(
    kubeconfig: Path, namespace: str, job: str, worker: int, *, cordon: bool = False
) -> tuple[str, str]:
    """Drain `worker`'s node as `kubectl drain` does to the job: cordon it first (when
    `cordon`), then evict the worker's pod through an Eviction, honouring
    PodDisruptionBudgets. Other pods on the node stay (an operator pod among them would
    add a leader failover to the job's figure). Returns (pod, node)."""
    core = client.CoreV1Api(config.new_client_from_config(config_file=str(kubeconfig)))
    pod = worker_pod(kubeconfig, namespace, job, worker)
    name, node = pod.metadata.name, pod.spec.node_name
    if cordon:
        set_unschedulable(kubeconfig, node, True)
    body = client.V1Eviction(metadata=client.V1ObjectMeta(name=name, namespace=namespace))
    core.create_namespaced_pod_eviction(name, namespace, body)
    return name, node


def set_unschedulable(kubeconfig: Path, node: str, unschedulable: bool) -> None:
    """`kubectl cordon` (True) or `uncordon` (False): the Node's spec.unschedulable."""
    core = client.CoreV1Api(config.new_client_from_config(config_file=str(kubeconfig)))
    core.patch_node(node, {"spec": {"unschedulable": unschedulable or None}})


def inject(kind: str, pid: int, done: threading.Event, slow_seconds: float) -> threading.Thread:
    """Start fault `kind` on `pid`; the thread ends when `done` is set (or the slow ends)."""
    actions = {"kill": _kill, "stop": _stop, "slow": _slow}
    if kind not in actions:
        raise ValueError(f"fault kind {kind!r}: expected one of {sorted(actions)}")
    thread = threading.Thread(
        target=actions[kind], args=(pid, done, slow_seconds), name=f"fault-{kind}", daemon=True
    )
    thread.start()
    return thread


def _signal(pid: int, signum: int) -> bool:
    try:
        os.kill(pid, signum)
        return True
    except ProcessLookupError:
        return False


def _kill(pid: int, done: threading.Event, _: float) -> None:
    _signal(pid, signal.SIGKILL)


def _stop(pid: int, done: threading.Event, _: float) -> None:
    _signal(pid, signal.SIGSTOP)
    done.wait()
    _signal(pid, signal.SIGCONT)  # if nobody killed it, it must not stay stopped after the run


def _slow(pid: int, done: threading.Event, seconds: float) -> None:
    """Half the CPU time the process was getting, for `seconds`: a cgroup v1 CPU quota of
    half its measured use, over a short period so that every forward pass is stretched
    (a coarse stop/continue cycle lands mostly outside the ~10 ms forward, which the
    runtime times, and its median hardly moves)."""
    try:
        cgroup = SlowCgroup.around(pid)
    except (OSError, ValueError) as error:
        print(f"slow: no CPU cgroup for pid {pid} ({error}); not slowed", flush=True)
        return
    try:
        done.wait(seconds)
    finally:
        cgroup.remove()


CGROUP_CPU = Path("/sys/fs/cgroup/cpu")
QUOTA_PERIOD_US = 20_000  # 20 ms periods: throttled within each forward, not between them
MIN_QUOTA_US = 1_000  # the kernel's floor for cpu.cfs_quota_us
MEASURE_SECONDS = 2.0


def cpu_cgroup_path(cgroup_file: str) -> str:
    """The process's cgroup in the v1 `cpu` hierarchy, from /proc/<pid>/cgroup."""
    for line in cgroup_file.splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            return path
    raise ValueError("no cgroup v1 cpu controller in /proc/<pid>/cgroup")


def half_quota_us(cpu_seconds: float, wall_seconds: float, period_us: int) -> int:
    """A quota per period of half the share of a CPU the process used (cpu / wall)."""
    if wall_seconds <= 0:
        raise ValueError(f"wall_seconds {wall_seconds}: expected > 0")
    share = max(0.0, cpu_seconds / wall_seconds)
    return max(MIN_QUOTA_US, int(period_us * share / 2))


def cpu_seconds(pid: int, proc: Path = Path("/proc")) -> float:
    """utime + stime of every thread of `pid` (proc(5) fields 14 and 15)."""
    fields = (proc / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class SlowCgroup:
    """A child of the process's own cpu cgroup (so its container's limits still hold)
    holding the process under a quota; removed, and the process moved back, at the end."""

    def __init__(self, pid: int, home: Path, slow: Path, quota_us: int, share: float) -> None:
        self.pid, self.home, self.slow = pid, home, slow
        self.quota_us, self.share = quota_us, share

    @classmethod
    def around(cls, pid: int) -> SlowCgroup:
        home = CGROUP_CPU / cpu_cgroup_path(Path(f"/proc/{pid}/cgroup").read_text()).lstrip("/")
        began, used = time.monotonic(), cpu_seconds(pid)
        time.sleep(MEASURE_SECONDS)
        wall, cpu = time.monotonic() - began, cpu_seconds(pid) - used
        quota = half_quota_us(cpu, wall, QUOTA_PERIOD_US)
        slow = home / f"trainwave-slow-{pid}"
        slow.mkdir(exist_ok=True)
        (slow / "cpu.cfs_period_us").write_text(str(QUOTA_PERIOD_US))
        (slow / "cpu.cfs_quota_us").write_text(str(quota))
        (slow / "cgroup.procs").write_text(str(pid))  # every thread of the process
        print(f"slow: pid {pid} used {cpu / wall:.2f} CPU; quota {quota} us per "
              f"{QUOTA_PERIOD_US} us in {slow}", flush=True)  # fmt: skip
        return cls(pid, home, slow, quota, cpu / wall)

    def remove(self) -> None:
        with contextlib.suppress(OSError):  # gone already (an in-place restart killed it)
            (self.home / "cgroup.procs").write_text(str(self.pid))
        for _ in range(20):
            try:
                self.slow.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:  # busy while the last task leaves
                time.sleep(0.1)


class StatusWatch:
    """Polls one TrainingJob twice a second and keeps each change of what matters here."""

    def __init__(self, kubeconfig: Path, namespace: str, name: str, every: float = 0.5) -> None:
        api_client = config.new_client_from_config(config_file=str(kubeconfig))
        self._api = client.CustomObjectsApi(api_client)
        self._where = (namespace, name)
        self._every = every
        self._changes: list[tuple[float, dict[str, Any]]] = []
        self._status: dict[str, Any] = {}
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="status-watch", daemon=True)

    def start(self) -> StatusWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        namespace, name = self._where
        while not self._stopped.is_set():
            try:
                found = self._api.get_namespaced_custom_object(
                    "trainwave.io", "v1alpha1", namespace, "trainingjobs", name
                )
            except client.ApiException:
                found = {}
            status = found.get("status") or {}
            self._status = status
            view = _view(status)
            if not self._changes or self._changes[-1][1] != view:
                self._changes.append((time.time(), view))
            self._stopped.wait(self._every)

    def last(self) -> dict[str, Any]:
        return dict(self._status)

    def phase(self) -> str | None:
        return self._status.get("phase")

    def changes(self) -> list[dict[str, Any]]:
        return [{"t": round(t, 2), **view} for t, view in self._changes]

    def first_change_after(self, since: float) -> float | None:
        """When the status first showed a repair or a hang after `since`."""
        return first_change_after(self._changes, since)

    def wait_change_after(self, since: float, timeout: float) -> float | None:
        """first_change_after, waiting up to `timeout` s for it: a repair can complete
        before the operator's next read of the workers' reports shows it."""
        deadline = time.monotonic() + timeout
        while (found := self.first_change_after(since)) is None and time.monotonic() < deadline:
            time.sleep(0.25)
        return found

    def wait_condition(self, kind: str, text: str, since: float, timeout: float) -> float | None:
        """When condition `kind` first showed True with `text` in its message after `since`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for t, view in self._changes:
                status, message = view["conditions"].get(kind, ("", ""))
                if t > since and status == "True" and text in message:
                    return t
            time.sleep(0.25)
        return None


def _view(status: dict[str, Any]) -> dict[str, Any]:
    goodput = status.get("goodput") or {}
    return {
        "phase": status.get("phase"),
        "attempt": status.get("attempt"),
        "restarts": status.get("restarts"),
        "in_place": goodput.get("inPlaceRestarts"),
        "disruptions": status.get("disruptions"),
        "replacements": (status.get("replacements") or {}).get("total"),
        "conditions": {
            c.get("type"): (c.get("status"), c.get("message", ""))
            for c in status.get("conditions") or []
            if c.get("type") in ("Hung", "Straggler", "Running")
        },
    }


REPAIR_COUNTS = ("attempt", "restarts", "in_place", "disruptions", "replacements")


def first_change_after(changes: list[tuple[float, dict[str, Any]]], since: float) -> float | None:
    """The first time after `since` a count of repairs went up (attempt, restarts, in-place
    restarts, disruptions, workers replaced) or the Hung condition turned True. Counts that first appear (None -> 0) are
    not news."""
    before = next((v for t, v in reversed(changes) if t <= since), None)
    if before is None:
        return None
    for t, view in changes:
        if t <= since:
            continue
        if any((view.get(k) or 0) > (before.get(k) or 0) for k in REPAIR_COUNTS):
            return t
        if view["conditions"].get("Hung", ("", ""))[0] == "True":
            return t
    return None
