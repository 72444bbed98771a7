"""One job cannot write another's status, even from the same IP, on the real control plane.

Two jobs run with hostNetwork, so kwok gives both workers their node's address
(127.0.0.1 here, like two jobs sharing a real node) and the operator reads each
on that address at the job's status port. The test serves both ports itself:
job A's with the runtime's own StatusServer and signer, keyed with the Secret
the operator created for A (read the way the kubelet mounts it); job B's with a
forger, A's code claiming B's identity with the only key it has, A's. A's
progress reaches A's status; B's status never shows the forged progress.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest

from cluster.deploy import free_port
from integration.trainwave_fixtures import (
    apply,
    env_of,
    get_json,
    job,
    job_manifest,
    wait_for_phase,
    wait_until,
    worker_pods,
)
from trainwave import contract, signatures
from trainwave.runtime.launch import status_signer
from trainwave.runtime.launcher.status import StatusServer
from trainwave.runtime.settings import load_settings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def host_network_job(name: str, status_port: int) -> dict[str, Any]:
    # Distinct rendezvous ports too: on hostNetwork every container port is a host
    # port, and two equal ones could not share a node.
    return job_manifest(
        name,
        run_for="300s",
        masterPort=free_port(),
        runtime={"statusPort": status_port},
        template_spec={"hostNetwork": True},
    )


def forged_reads(operator: Any) -> float:
    found = re.search(r'^trainwave_status_reads_total\{outcome="forged"\} (\S+)$',
                      operator.metrics(), re.M)  # fmt: skip
    return float(found.group(1)) if found else 0.0


@pytest.fixture
def servers() -> Iterator[ExitStack]:
    with ExitStack() as stack:
        yield stack


def test_a_job_cannot_write_another_jobs_progress_from_a_shared_ip(
    cluster, namespace, running_operator, servers, tmp_path: Path
):
    port_a, port_b = free_port(), free_port()
    apply(cluster, namespace, host_network_job("alpha", port_a), host_network_job("beta", port_b))
    for name in ("alpha", "beta"):
        wait_for_phase(cluster, namespace, name, "Running", timeout=90)
    [pod_a] = worker_pods(cluster, namespace, "alpha")
    [pod_b] = worker_pods(cluster, namespace, "beta")
    assert pod_a["status"]["podIP"] == pod_b["status"]["podIP"] == "127.0.0.1"

    # The operator made a Secret per job, owned by it, and mounted it into its worker.
    uid_a = job(cluster, namespace, "alpha")["metadata"]["uid"]
    secret = get_json(cluster, namespace, "secret", f"alpha-status-key-{uid_a[:8]}")
    assert secret["metadata"]["ownerReferences"][0]["uid"] == uid_a
    volumes = {v["name"]: v for v in pod_a["spec"]["volumes"]}
    assert volumes[contract.STATUS_KEY_VOLUME]["secret"]["secretName"] == secret["metadata"]["name"]
    key_a = base64.b64decode(secret["data"][contract.STATUS_KEY_FILE]).decode()
    key_file = tmp_path / "alpha.key"
    key_file.write_text(key_a)

    # Job A's worker: the launcher's own signer, configured from the pod's own env.
    settings_a = load_settings({**env_of(pod_a), contract.ENV_STATUS_KEY_FILE: str(key_file)})
    honest = {"namespace": namespace, "job": "alpha", "attempt": 0, "node_rank": 0,
              "progress": {"step": 11, "total_steps": 100}}  # fmt: skip
    servers.enter_context(_serving(port_a, honest, status_signer(settings_a)))

    # Job A's code again, now answering where the operator asks for job B.
    forged = {"namespace": namespace, "job": "beta", "attempt": 0, "node_rank": 0,
              "progress": {"step": 999, "total_steps": 1000}}  # fmt: skip
    as_beta = signatures.Identity(namespace, "beta", 0, 0)
    stolen = signatures.key_from_text(key_a)
    before = forged_reads(running_operator)
    servers.enter_context(
        _serving(port_b, forged, lambda nonce, body: signatures.sign(stolen, as_beta, nonce, body))
    )

    def alpha_progress() -> dict[str, Any] | None:
        return job(cluster, namespace, "alpha").get("status", {}).get("progress")

    progress = wait_until(alpha_progress, 60, "alpha's progress from its signed report")
    assert progress["step"] == 11
    wait_until(lambda: forged_reads(running_operator) > before, 60, "beta's forged report refused")
    assert "progress" not in job(cluster, namespace, "beta").get("status", {})
    assert re.search(
        rf"{namespace}/beta rank 0 .* report refused: signature", running_operator.tail(200)
    )


@contextmanager
def _serving(port: int, document: dict[str, Any], signer: Any) -> Iterator[None]:
    server = StatusServer("127.0.0.1", port, lambda: document, signer).start()
    try:
        yield
    finally:
        server.stop()
