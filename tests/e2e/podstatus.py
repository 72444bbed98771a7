"""Pod status as a kubelet reports it, from what the pod's processes did. Pure.

The shapes match what tests/cluster/stages/*.yaml give kwok pods (and what
a real kubelet writes): phase, podIP(s), hostIP(s), startTime, the
Initialized / ContainersReady / Ready conditions, and one status per init
container and container whose state is waiting, running, or terminated with
exitCode, reason, startedAt and finishedAt. With restartPolicy Never (the
only policy trainwave uses) nothing restarts: a failed init container fails
the pod, and once every container has terminated the pod has Succeeded if all
exited 0, else Failed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# What container runtimes report for a command that could not be started.
START_ERROR_EXIT_CODE = 128


@dataclass
class ContainerState:
    name: str
    image: str
    started_at: str | None = None
    finished_at: str | None = None
    exit_code: int | None = None
    reason: str = ""
    message: str = ""

    @property
    def running(self) -> bool:
        return self.started_at is not None and self.exit_code is None

    @property
    def terminated(self) -> bool:
        return self.exit_code is not None

    def start(self, now: str) -> None:
        self.started_at = now

    def exit(self, code: int, now: str, reason: str = "", message: str = "") -> None:
        self.exit_code = code
        self.finished_at = now
        self.started_at = self.started_at or now
        self.reason = reason or ("Completed" if code == 0 else "Error")
        self.message = message

    def as_status(self, *, init: bool, waiting_reason: str) -> dict[str, Any]:
        status: dict[str, Any] = {
            "name": self.name,
            "image": self.image,
            "imageID": "",
            "restartCount": 0,
            "ready": self.exit_code == 0 if init else self.running,
            "started": self.running,
        }
        if self.terminated:
            terminated = {
                "exitCode": self.exit_code,
                "reason": self.reason,
                "startedAt": self.started_at,
                "finishedAt": self.finished_at,
            }
            if self.message:
                terminated["message"] = self.message
            status["state"] = {"terminated": terminated}
        elif self.running:
            status["state"] = {"running": {"startedAt": self.started_at}}
        else:
            status["state"] = {"waiting": {"reason": waiting_reason}}
        return status


@dataclass
class PodState:
    """Every container of one pod, in spec order."""

    ip: str
    host_ip: str
    start_time: str
    init: list[ContainerState] = field(default_factory=list)
    main: list[ContainerState] = field(default_factory=list)

    @classmethod
    def of(cls, pod: Mapping[str, Any], ip: str, host_ip: str, now: str) -> PodState:
        spec = pod.get("spec") or {}

        def states(key: str) -> list[ContainerState]:
            return [ContainerState(c["name"], c.get("image", "")) for c in spec.get(key) or []]

        return cls(ip, host_ip, now, states("initContainers"), states("containers"))

    def container(self, name: str) -> ContainerState:
        return next(c for c in [*self.init, *self.main] if c.name == name)

    @property
    def initialized(self) -> bool:
        return all(c.exit_code == 0 for c in self.init)

    @property
    def phase(self) -> str:
        if any(c.terminated and c.exit_code != 0 for c in self.init):
            return "Failed"
        if self.main and all(c.terminated for c in self.main):
            return "Succeeded" if all(c.exit_code == 0 for c in self.main) else "Failed"
        if self.initialized and any(c.started_at for c in self.main):
            return "Running"
        return "Pending"

    def end_all(self, code: int, now: str, message: str) -> None:
        """Containers still running (or never started) when the pod's processes all ended."""
        for container in [*self.init, *self.main]:
            if container.running:
                container.exit(code, now, message=message)

    def status(self, now: str, current: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
        """The whole status; `current` conditions of other writers (the scheduler) are kept,
        and ours keep their transition time while their value holds."""
        phase = self.phase
        ready = phase == "Running" and all(c.running for c in self.main)
        waiting = "PodInitializing" if not self.initialized else "ContainerCreating"
        ours = {
            "Initialized": self.initialized,
            "ContainersReady": ready,
            "Ready": ready,
        }
        conditions = [dict(c) for c in current if c.get("type") not in ours]
        previous = {c.get("type"): c for c in current}
        for kind, true in ours.items():
            value = "True" if true else "False"
            before = previous.get(kind) or {}
            since = before.get("lastTransitionTime") if before.get("status") == value else None
            condition: dict[str, Any] = {
                "type": kind,
                "status": value,
                "lastTransitionTime": since or now,
            }
            if not true and phase in ("Succeeded", "Failed"):
                condition["reason"] = "PodCompleted" if phase == "Succeeded" else "PodFailed"
            conditions.append(condition)
        return {
            "phase": phase,
            "conditions": conditions,
            "hostIP": self.host_ip,
            "hostIPs": [{"ip": self.host_ip}],
            "podIP": self.ip,
            "podIPs": [{"ip": self.ip}],
            "startTime": self.start_time,
            "initContainerStatuses": [
                c.as_status(init=True, waiting_reason="PodInitializing") for c in self.init
            ],
            "containerStatuses": [
                c.as_status(init=False, waiting_reason=waiting) for c in self.main
            ],
        }
