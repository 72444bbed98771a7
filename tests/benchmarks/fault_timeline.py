"""Where the time goes between a worker's pod taken and the gang's first new step
(bench_replace.py): pods and the job polled twice a second, then the pods' own timestamps,
the namespace's Events and the workers' logs (kubelet timestamps, this machine's clock)."""

from __future__ import annotations

import json
import statistics
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from kubernetes import client

from cluster.controlplane import Cluster
from e2e.test_inplace_restart import first_step_after, timestamped_log


class PodWatch:
    """When each pod of a namespace was first seen, seen deleting and seen gone, and when
    the job's (phase, reason) changed, from polls every `every` seconds."""

    def __init__(self, core: client.CoreV1Api, namespace: str, every: float = 0.5) -> None:
        self._core = core
        self._custom = client.CustomObjectsApi(core.api_client)
        self._namespace = namespace
        self._every = every
        self.pods: dict[str, dict[str, Any]] = {}  # uid -> name, seen, deleting, gone
        self.job_changes: list[tuple[float, str, str]] = []
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pod-watch", daemon=True)

    def start(self) -> PodWatch:
        self._poll()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stopped.wait(self._every):
            try:
                self._poll()
            except client.ApiException:
                continue

    def _poll(self) -> None:
        now = time.time()
        listed = self._core.list_namespaced_pod(self._namespace).items
        present = set()
        for pod in listed:
            uid = pod.metadata.uid
            present.add(uid)
            entry = self.pods.setdefault(uid, {"name": pod.metadata.name, "seen": now})
            if pod.metadata.deletion_timestamp is not None:
                entry.setdefault("deleting", now)
        for entry_uid, entry in self.pods.items():
            if entry_uid not in present:
                entry.setdefault("gone", now)
        jobs = self._custom.list_namespaced_custom_object(
            "trainwave.io", "v1alpha1", self._namespace, "trainingjobs"
        )["items"]
        for job in jobs:
            status = job.get("status") or {}
            view = (str(status.get("phase")), str(status.get("reason")))
            if not self.job_changes or self.job_changes[-1][1:] != view:
                self.job_changes.append((now, *view))


def _stamp(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.timestamp()
    return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()


def _container_started(status: Any) -> float | None:
    if status is None or status.state is None:
        return None
    state = status.state.running or status.state.terminated
    return _stamp(state.started_at) if state is not None else None


def _new_pod_phases(pod: Any, fault: float) -> dict[str, float | None]:
    """Seconds after the fault of each step of a pod's start, from its own status."""

    def since(at: float | None) -> float | None:
        return None if at is None else round(at - fault, 1)

    scheduled = next((c for c in pod.status.conditions or [] if c.type == "PodScheduled"), None)
    init = (pod.status.init_container_statuses or [None])[0]
    init_done = init.state.terminated if init is not None and init.state is not None else None
    worker = (pod.status.container_statuses or [None])[0]
    return {
        "created": since(_stamp(pod.metadata.creation_timestamp)),
        "scheduled": since(_stamp(scheduled.last_transition_time) if scheduled else None),
        "init_started": since(_stamp(init_done.started_at) if init_done else None),
        "init_finished": since(_stamp(init_done.finished_at) if init_done else None),
        "worker_started": since(_container_started(worker)),
    }


def _events_after(core: client.CoreV1Api, namespace: str, fault: float) -> list[dict[str, Any]]:
    found = []
    for event in core.list_namespaced_event(namespace).items:
        at = _stamp(event.event_time or event.first_timestamp or event.last_timestamp)
        if at is not None and at >= int(fault):  # Events carry whole seconds
            found.append({
                "at": round(at - fault, 1),
                "object": f"{event.involved_object.kind}/{event.involved_object.name}",
                "reason": event.reason,
                "message": (event.message or "")[:160],
            })  # fmt: skip
    return sorted(found, key=lambda e: e["at"])


def _log_marks(lines: list[tuple[float, str]], fault: float) -> dict[str, float | None]:
    """The first line after the fault, torch's first "Rendezvous complete" after it and the
    training script's "start" (process group formed, checkpoint loaded) after it."""

    def first(match: str) -> float | None:
        at = next((t for t, text in lines if t >= fault and match in text), None)
        return None if at is None else round(at - fault, 1)

    after = [t for t, _ in lines if t >= fault]
    return {
        "first_line": round(after[0] - fault, 1) if after else None,
        "agent_up": first("Starting elastic_operator"),
        "worker_group_failed": first("FAILED"),
        "joined_round": first("has joined round"),
        "rendezvous_complete": first("Rendezvous complete"),
        "launcher_restart": first('"event": "restart"'),
        "training_start": first('"event": "start"'),
    }


def timeline(
    cluster: Cluster,
    core: client.CoreV1Api,
    *,
    namespace: str,
    name: str,
    mode: str,
    fault: float,
    watch: PodWatch,
    keep_logs: Path | None = None,
) -> dict[str, Any]:
    """The figures of one mode, as seconds after the fault."""
    release = _LogReader(cluster)
    old = {uid: e for uid, e in watch.pods.items() if e["seen"] < fault}
    victim = next(e for e in old.values() if e["name"].endswith("-worker-1"))
    decided = next(((t, p, r) for t, p, r in watch.job_changes if t >= fault), None)
    new_pods = [p for p in core.list_namespaced_pod(namespace).items if p.metadata.uid not in old]
    worker0 = f"{name}-a0-worker-0" if mode == "replace" else f"{name}-a1-worker-0"
    rank0 = timestamped_log(release, namespace, worker0)  # type: ignore[arg-type]
    if keep_logs is not None:
        keep_logs.mkdir(parents=True, exist_ok=True)
        (keep_logs / "pods.json").write_text(
            json.dumps(
                core.api_client.sanitize_for_serialization(core.list_namespaced_pod(namespace)),
                indent=1,
            )
        )
        for pod in core.list_namespaced_pod(namespace).items:
            lines = timestamped_log(release, namespace, pod.metadata.name)  # type: ignore[arg-type]
            text = "\n".join(f"{t - fault:8.2f} {line}" for t, line in lines)
            (keep_logs / f"{pod.metadata.name}.log").write_text(text + "\n")
    first_at, first_step = first_step_after(rank0, fault)
    logs = {}
    for pod in new_pods:
        lines = timestamped_log(release, namespace, pod.metadata.name)  # type: ignore[arg-type]
        logs[pod.metadata.name] = _log_marks(lines, fault)
    if mode == "replace":
        logs[f"{worker0} (kept)"] = _log_marks(rank0, fault)
    return {
        "fault_to_first_new_step": round(first_at - fault, 1),
        "first_new_step": first_step,
        "old_victim_deleting_seen": _since(victim.get("deleting"), fault),
        "old_victim_gone": _since(victim.get("gone"), fault),
        "old_pods_gone": _since(max((e.get("gone") or 0) for e in old.values()) or None, fault),
        "job_first_change": None
        if decided is None
        else {"at": round(decided[0] - fault, 1), "phase": decided[1], "reason": decided[2]},
        "job_changes": [(round(t - fault, 1), p, r) for t, p, r in watch.job_changes],
        "new_pods": {p.metadata.name: _new_pod_phases(p, fault) for p in new_pods},
        "grace_seconds": new_pods[0].spec.termination_grace_period_seconds if new_pods else None,
        "logs": logs,
        "events": _events_after(core, namespace, fault),
    }


def _since(at: float | None, fault: float) -> float | None:
    return None if at is None else round(at - fault, 1)


class _LogReader:
    """What timestamped_log needs of a Release: the cluster's kubectl."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster


def render_markdown(result: dict[str, Any]) -> str:
    rows = [
        ("eviction -> first new step (s)", "fault_to_first_new_step"),
        ("old worker 1 gone from the API", "old_victim_gone"),
        ("all old pods gone", "old_pods_gone"),
    ]
    runs = result["runs"]
    out = [
        f"# One worker evicted: replaced alone vs gang recreation (commit {result['commit']})",
        "",
        f"Conditions: {result['conditions']}",
        "",
        "| | " + " | ".join(f"{r['mode']} {r.get('round', '')}" for r in runs) + " |",
        "|---|" + "---|" * len(runs),
    ]
    for label, key in rows:
        out.append(f"| {label} | " + " | ".join(str(r.get(key)) for r in runs) + " |")
    out.append(
        "| job's first change | " + " | ".join(str(r.get("job_first_change")) for r in runs) + " |"
    )
    out.append("| load before / after | " + " | ".join(
        f"{r['load_before'][0]} / {r['load_after'][0]}" for r in runs) + " |")  # fmt: skip
    out += ["", "Median eviction -> first new step per mode:", ""]
    for mode in dict.fromkeys(r["mode"] for r in runs):
        seconds = sorted(r["fault_to_first_new_step"] for r in runs if r["mode"] == mode)
        out.append(f"- {mode}: {statistics.median(seconds):.1f} s of {seconds}")
    for run in runs:
        out += ["", f"## {run['mode']} {run.get('round', '')}: new pods (s after the eviction)", ""]
        for pod, phases in run["new_pods"].items():
            out.append(f"- {pod}: {phases}")
        out += ["", "Logs (s after the eviction):", ""]
        for pod, marks in run["logs"].items():
            out.append(f"- {pod}: {marks}")
        out += ["", "Events:", ""]
        for event in run["events"]:
            out.append(f"- +{event['at']} {event['object']} {event['reason']}: {event['message']}")
    return "\n".join(out) + "\n"
