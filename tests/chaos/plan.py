"""The chaos run's plan and its oracle. Pure: a seed in, jobs and faults out; evidence in,
expectations out. No cluster, no clock, so tests/unit checks the oracle on its own.

Jobs. Each job's simulated workers end the same way in every attempt (kwok's stages read
the job's template annotations), so without disruptions its end is fixed by its kind:
    ok        succeed after run_for                         Succeeded/Succeeded
    fragile   as ok, but maxDisruptions 0                   Succeeded, or Failed/MaxDisruptionsExceeded
    flaky     exit 1 each attempt, maxRestarts m (0..2)     Failed/MaxRestartsExceeded after m restarts
    fatal     exit 3, matched by a FailJob exit-code rule   Failed/FailedByRule in attempt 0
    oom       OOMKilled, matched by a FailJob onReasons rule Failed/FailedByRule in attempt 0
    ignored   exit 42, an Ignore rule, maxIgnoredRestarts k Failed/MaxIgnoredRestartsExceeded
A disruption (eviction, node deleted, node NotReady past its grace) that hits a job adds one uncounted attempt and one
to status.disruptions, and changes nothing else, except for `fragile`, whose first
disruption fails it. Which jobs a disruption hit is evidence recorded by the run at the
moment of injection (the pods on the node, the pod evicted); the oracle takes it as given.

Faults. A seeded, serial schedule: each fault is injected, recovered from, then the next
waits a seeded gap. Faults of the operator and the control plane must change no job's
outcome; node NotReady flaps shorter than nodeNotReadySeconds must not either, while a
node NotReady longer than that is a disruption of every job with a worker there.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

KINDS = ("ok", "fragile", "flaky", "fatal", "oom", "ignored")
# How often each kind is drawn: mostly jobs that run to success, as on a real cluster.
WEIGHTS = (5, 1, 2, 1, 1, 1)

# fault kind -> how many per run. Disruptions (evict, delete-node) need a victim in a safe
# window and are counted only when one was found; the others always happen.
FAULTS = {
    "sigkill-leader": 2,
    "sigkill-standby": 1,
    "sigstop-leader-short": 1,  # shorter than renewDeadline: it carries on as leader
    "sigstop-leader-long": 1,  # longer than leaseDuration: the standby takes over
    "sigstop-standby": 1,
    "restart-apiserver": 2,
    "restart-kwok": 2,
    "node-flap": 2,
    "node-not-ready": 1,  # past every job's nodeNotReadySeconds: a disruption
    "delete-node": 2,
    "evict": 4,
}
DISRUPTIVE = frozenset({"delete-node", "evict", "node-not-ready"})
# Every job's nodeNotReadySeconds. Flaps last well under it (the node is Ready again a
# kubectl round trip after the hold); a long NotReady outlasts it by NOT_READY_PAST.
GRACE_SECONDS = 15
NOT_READY_PAST = 8


@dataclass(frozen=True)
class JobPlan:
    name: str
    kind: str
    workers: int
    gpus: int
    run_for: int  # seconds each attempt's workers run before they end
    budget: int = 0  # maxRestarts for flaky, maxIgnoredRestarts for ignored

    def failure_policy(self) -> dict[str, Any]:
        policy: dict[str, Any] = {"nodeNotReadySeconds": GRACE_SECONDS}
        if self.kind == "fragile":
            policy["maxDisruptions"] = 0
        elif self.kind == "flaky":
            policy["maxRestarts"] = self.budget
        elif self.kind == "fatal":
            policy["rules"] = [
                {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [3]}}
            ]
        elif self.kind == "oom":
            policy["rules"] = [{"action": "FailJob", "onReasons": ["OOMKilled"]}]
        elif self.kind == "ignored":
            policy |= {"maxIgnoredRestarts": self.budget, "ignoreBackoffSeconds": 1}
            policy["rules"] = [
                {"action": "Ignore", "onExitCodes": {"operator": "In", "values": [42]}}
            ]
        return policy

    def simulation(self) -> dict[str, str]:
        """The template annotations kwok's stages play (tests/cluster/stages)."""
        result = "Succeeded" if self.kind in ("ok", "fragile") else "Failed"
        annotations = {
            "sim.trainwave.io/result": result,
            "sim.trainwave.io/run-for": f"{self.run_for}s",
        }
        code = {"flaky": 1, "fatal": 3, "oom": 137, "ignored": 42}.get(self.kind)
        if code is not None:
            annotations["sim.trainwave.io/exit-code"] = str(code)
        if self.kind == "oom":
            annotations["sim.trainwave.io/reason"] = "OOMKilled"
        return annotations


@dataclass(frozen=True)
class Fault:
    kind: str
    gap: float  # seconds to wait after the previous fault recovered
    hold: float = 0.0  # how long a SIGSTOP or a NotReady flap lasts


@dataclass(frozen=True)
class Expected:
    phase: str
    reason: str
    restarts: int = 0
    disruptions: int = 0
    ignored_restarts: int = 0
    preemptions: int = 0
    attempts: int = 1  # status.attempt + 1

    def counters(self) -> dict[str, int]:
        return {
            "restarts": self.restarts,
            "disruptions": self.disruptions,
            "ignoredRestarts": self.ignored_restarts,
            "preemptions": self.preemptions,
            "attempt": self.attempts - 1,
        }


@dataclass
class Plan:
    seed: int
    jobs: list[JobPlan]
    faults: list[Fault] = field(default_factory=list)

    def fault_counts(self) -> Counter[str]:
        return Counter(f.kind for f in self.faults)


def make_plan(seed: int, jobs: int = 54) -> Plan:
    rng = random.Random(seed)
    planned = []
    for index in range(jobs):
        kind = rng.choices(KINDS, WEIGHTS)[0]
        budget = rng.randint(0, 2) if kind == "flaky" else (1 if kind == "ignored" else 0)
        # Long enough that a disruption can land well before the workers end (SAFE_MARGIN
        # in the run; a node NotReady needs every hit worker to outlast the grace, 15 s,
        # plus the margin), short enough that the whole mix drains in a few minutes.
        run_for = rng.randint(20, 40) if kind in ("ok", "fragile") else rng.randint(8, 12)
        planned.append(
            JobPlan(
                name=f"{kind}-{index:02d}",
                kind=kind,
                workers=rng.choice((1, 2, 2, 3)),
                gpus=rng.choice((2, 4)),
                run_for=run_for,
                budget=budget,
            )
        )
    faults = [kind for kind, count in FAULTS.items() for _ in range(count)]
    rng.shuffle(faults)
    return Plan(seed, planned, [_fault(kind, rng) for kind in faults])


def _fault(kind: str, rng: random.Random) -> Fault:
    hold = 0.0
    if kind in ("sigstop-leader-short", "sigstop-standby"):
        hold = rng.uniform(2, 6)  # renewDeadline is 10 s
    elif kind == "sigstop-leader-long":
        hold = rng.uniform(18, 22)  # leaseDuration 15 s + retryPeriod: the standby acquires
    elif kind == "node-flap":
        hold = rng.uniform(2, 6)  # well under GRACE_SECONDS
    elif kind == "node-not-ready":
        hold = GRACE_SECONDS + NOT_READY_PAST
    return Fault(kind, gap=rng.uniform(2, 6), hold=round(hold, 1))


def expect(job: JobPlan, disruptions: int) -> Expected:
    """The end state of `job` after `disruptions` disruptions hit it (evidence of the run)."""
    d = disruptions
    if job.kind == "ok":
        return Expected("Succeeded", "Succeeded", disruptions=d, attempts=1 + d)
    if job.kind == "fragile":
        if d:  # the first one fails it: maxDisruptions is 0
            return Expected("Failed", "MaxDisruptionsExceeded")
        return Expected("Succeeded", "Succeeded")
    if job.kind == "flaky":
        return Expected(
            "Failed", "MaxRestartsExceeded", restarts=job.budget, disruptions=d,
            attempts=job.budget + 1 + d,
        )  # fmt: skip
    if job.kind in ("fatal", "oom"):
        return Expected("Failed", "FailedByRule", disruptions=d, attempts=1 + d)
    if job.kind == "ignored":
        return Expected(
            "Failed", "MaxIgnoredRestartsExceeded", ignored_restarts=job.budget,
            disruptions=d, attempts=job.budget + 1 + d,
        )  # fmt: skip
    raise ValueError(f"unknown kind {job.kind!r}")


def expected_pods(job: JobPlan, attempts: int) -> set[str]:
    """Every pod name the job's attempts create: each attempt creates its whole gang."""
    return {
        f"{job.name}-a{attempt}-worker-{rank}"
        for attempt in range(attempts)
        for rank in range(job.workers)
    }


def violations(
    job: JobPlan, expected: Expected, status: dict[str, Any], created: set[str]
) -> list[str]:
    """What differs between the job's end and the oracle's, one line each."""
    found = []
    seen = (status.get("phase"), status.get("reason"))
    if seen != (expected.phase, expected.reason):
        found.append(
            f"{job.name}: phase/reason {seen}, expected {(expected.phase, expected.reason)}"
        )
    for counter, want in expected.counters().items():
        got = status.get(counter, 0)
        if got != want:
            found.append(f"{job.name}: {counter} {got}, expected {want}")
    pods = expected_pods(job, expected.attempts)
    if created != pods:
        found.append(
            f"{job.name}: pods extra {sorted(created - pods)}, missing {sorted(pods - created)}"
        )
    return found
