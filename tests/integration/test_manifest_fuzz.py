"""Fuzzing the whole path: 1,000 generated TrainingJobs sent to the real API server.

Each manifest (tests/unit/manifest_strategies.py: valid specs, mostly broken on
purpose, wrong types inside the pod template above all) is either refused by the
API server with a message naming the field, or accepted and then brought by the
operator to a terminal or clearly-reasoned state: Succeeded, Failed with a reason
(InvalidSpec naming the field, exactly what resolve() says of the stored body),
Scheduling with the placer's reason (not `Placing`, which means the placer has not
answered for the gang yet), Running. Beside them a healthy job must still succeed,
the operator must stay alive with no traceback in its log, and no job may show
ReconcileError. The figures are printed (run with -s) for the README.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, seed, settings
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from integration.trainwave_fixtures import apply, job_manifest, wait_for_phase
from trainwave import contract
from trainwave.api.trainingjob import InvalidSpec
from trainwave.resolving import resolve
from unit.manifest_strategies import specs

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]
MANIFESTS = int(os.environ.get("TRAINWAVE_FUZZ_MANIFESTS", "1000"))
SEED = 20260110
SETTLE_SECONDS = 300
SIM = {"sim.trainwave.io/result": "Succeeded", "sim.trainwave.io/run-for": "1s"}
# "spec.workers: Invalid value", "spec.template.metadata.labels.a: Invalid value",
# 'unknown field "spec.fuzzField"', "spec.gpuSharing needs ...".
NAMES_FIELD = re.compile(r"\b(spec|metadata)(\.[A-Za-z]+|\[| )")


def generate(count: int) -> list[dict[str, Any]]:
    """`count` specs, the same ones every run (a fixed seed, generation only)."""
    found: list[dict[str, Any]] = []

    @seed(SEED)
    @settings(max_examples=count, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(specs(annotations=SIM))
    def collect(spec: dict[str, Any]) -> None:
        found.append(spec)

    collect()
    return found


def api(cluster) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(config.new_client_from_config(str(cluster.kubeconfig)))


def create(custom: client.CustomObjectsApi, namespace: str, body: dict[str, Any]) -> str | None:
    """None if accepted, else the API server's message. Strict, as kubectl apply is."""
    try:
        custom.create_namespaced_custom_object(
            contract.GROUP, contract.VERSION, namespace, contract.PLURAL, body,
            field_validation="Strict",
        )  # fmt: skip
    except ApiException as error:
        refusal = error
    else:
        return None
    # A refusal of the input, never the server failing on it.
    assert refusal.status in (400, 422), f"{body['metadata']['name']}: {refusal}"
    return str(json.loads(refusal.body)["message"])


def verdict(job: dict[str, Any]) -> str | None:
    """The settled state of `job` as '<phase>/<reason>', or None while it is on its way."""
    status = job.get("status") or {}
    phase, reason, message = status.get("phase"), status.get("reason"), status.get("message")
    conditions = {c["type"]: c for c in status.get("conditions", [])}
    if conditions.get("ReconcileError", {}).get("status") == "True":
        return "ReconcileError"  # never settled: a violation
    if phase in ("Succeeded", "Running") or (phase == "Failed" and reason and message):
        return f"{phase}/{reason}"
    scheduled = conditions.get("Scheduled", {})
    # Placing: the placer has not answered for the gang yet, so it is still on its way.
    answered = scheduled.get("reason") not in (None, "Placing") and scheduled.get("message")
    if phase == "Scheduling" and scheduled.get("status") == "False" and answered:
        return f"{phase}/{scheduled['reason']}"
    return None


def expected_refusal(job: dict[str, Any]) -> str | None:
    """What the operator's own resolve says of the body the API server stored."""
    try:
        resolve(job)
    except InvalidSpec as invalid:
        return str(invalid)
    return None


def test_generated_manifests_are_refused_naming_the_field_or_settle_with_a_reason(
    cluster, namespace, running_operator
):
    started = time.monotonic()
    log_offset = running_operator.log_path.stat().st_size
    apply(cluster, namespace, job_manifest("control", workers=2, gpus=1, run_for="20s"))
    custom = api(cluster)

    manifests = generate(MANIFESTS)
    assert len(manifests) >= MANIFESTS, f"hypothesis generated {len(manifests)}"
    violations: list[str] = []
    refused: list[str] = []
    accepted: list[str] = []
    for index, spec in enumerate(manifests[:MANIFESTS]):
        name = f"fz-{index:04d}"
        body = {"apiVersion": contract.API_VERSION, "kind": contract.KIND,
                "metadata": {"name": name}, "spec": spec}  # fmt: skip
        message = create(custom, namespace, body)
        if message is None:
            accepted.append(name)
            continue
        refused.append(message)
        if not NAMES_FIELD.search(message):
            violations.append(f"{name}: refused without naming a field: {message}")
    created_in = time.monotonic() - started

    ends: dict[str, str | None] = dict.fromkeys(accepted)
    deadline = time.monotonic() + SETTLE_SECONDS
    while time.monotonic() < deadline:
        items = custom.list_namespaced_custom_object(
            contract.GROUP, contract.VERSION, namespace, contract.PLURAL
        )["items"]
        jobs = {j["metadata"]["name"]: j for j in items}
        for name in ends:
            ends[name] = verdict(jobs[name])
        if all(ends.values()) and "ReconcileError" not in ends.values():
            break
        time.sleep(3)
    for name, end in ends.items():
        job = jobs[name]
        if end in (None, "ReconcileError"):
            violations.append(f"{name}: not settled: {job.get('status')} spec={job['spec']}")
            continue
        refusal = expected_refusal(job)
        if refusal is not None and job["status"]["message"] != refusal:
            violations.append(f"{name}: resolve says {refusal!r}; status: {job['status']}")
        if end == "Failed/InvalidSpec" and not NAMES_FIELD.search(job["status"]["message"]):
            violations.append(f"{name}: InvalidSpec naming no field: {job['status']['message']}")

    wait_for_phase(cluster, namespace, "control", "Succeeded", timeout=120)
    apply(cluster, namespace, job_manifest("control-after", workers=2, gpus=1))
    wait_for_phase(cluster, namespace, "control-after", "Succeeded", timeout=120)
    log = running_operator.log_path.read_text(errors="replace")[log_offset:]
    if not running_operator.alive():
        violations.append("the operator died")
    violations.extend(f"operator log: {line}" for line in log.splitlines() if "Traceback" in line)

    figures = Counter(str(v) for v in ends.values())  # "None": never settled
    # Of the InvalidSpec ends, those only the API server could see (an unknown pod field).
    pod_rejected = sum(1 for j in jobs.values()
                       if (j.get("status") or {}).get("message", "").startswith("pod rejected"))  # fmt: skip
    print(f"\nmanifest fuzz: {MANIFESTS} manifests (seed {SEED}), {len(refused)} refused by the "
          f"API server, {len(accepted)} accepted, ends {dict(sorted(figures.items()))} "
          f"({pod_rejected} InvalidSpec from a pod the API server refused), "
          f"{len(violations)} violations, created in {created_in:.0f}s, "
          f"total {time.monotonic() - started:.0f}s")  # fmt: skip
    assert not violations, "\n".join(violations[:20])
