"""A worker the real kubelet cannot start says so on its job.

As a Job's pod with a mistyped image stays Pending, the gang stays Starting: nothing fails
it. What a user needs is the reason without reading every pod: the job's message names the
worker and what the kubelet reported, from the pod's container statuses
(lifecycle/observed.py `WorkerPod.stuck`) or, for a pod the kubelet cannot even set up (a
volume that does not mount), from its newest Event (controller/pod_events.py). The
image names a registry on this machine's loopback that nobody serves, so containerd's pull
is refused at once and nothing leaves the machine.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from cluster.realnode_net import NodeNetwork
from e2e.conftest import ON_REAL_NODE, WORKER_IMAGE, Release
from integration.trainwave_fixtures import apply, job, job_manifest, wait_until

MISSING_IMAGE = "localhost:5999/trainwave/missing:1"


def one_worker_job(name: str, image: str) -> dict[str, Any]:
    """One worker of one GPU on the real node, never finishing by itself."""
    template = {"nodeSelector": ON_REAL_NODE}
    return job_manifest(name, workers=1, gpus=1, result=None, image=image, template_spec=template)


def status_saying(release: Release, namespace: str, name: str, *words: str) -> dict[str, Any]:
    """The job's status once its message holds any of `words` (up to 180 s)."""

    def said() -> dict[str, Any] | None:
        status: dict[str, Any] = job(release.cluster, namespace, name).get("status") or {}
        message = str(status.get("message") or "")
        return status if any(word in message for word in words) else None

    return wait_until(said, 180, f"{' or '.join(words)} named on job {name}")


@pytest.mark.timeout(240)
def test_an_image_that_cannot_be_pulled_is_named_on_the_starting_job(
    release: Release, namespace: str
) -> None:
    cluster = release.cluster
    apply(cluster, namespace, one_worker_job("unpullable", MISSING_IMAGE))

    status = status_saying(release, namespace, "unpullable", "ErrImagePull", "ImagePullBackOff")
    assert status["phase"] == "Starting", status
    assert status["message"].startswith(
        "0/1 workers running; worker 0 (unpullable-a0-worker-0): container worker waiting: "
    ), status["message"]
    assert "localhost:5999/trainwave/missing:1" in status["message"], status["message"]


@pytest.mark.timeout(240)
def test_a_volume_that_does_not_mount_is_named_on_the_starting_job(
    release: Release, namespace: str
) -> None:
    """The pod sits Pending, its container ContainerCreating: the reason is only in the
    kubelet's FailedMount Event, which the operator lists once the worker has sat 10 s."""
    cluster = release.cluster
    manifest = job_manifest(
        "unmountable",
        workers=1,
        gpus=1,
        result=None,
        image=WORKER_IMAGE,
        imagePullPolicy="Never",
        template_spec={
            "nodeSelector": ON_REAL_NODE,
            "volumes": [{"name": "settings", "configMap": {"name": "no-such-settings"}}],
            "containers": [
                {"name": "worker", "volumeMounts": [{"name": "settings", "mountPath": "/cfg"}]}
            ],
        },
    )
    apply(cluster, namespace, manifest)

    status = status_saying(release, namespace, "unmountable", "FailedMount")
    assert status["phase"] == "Starting", status
    assert status["message"].startswith(
        "0/1 workers running; worker 0 (unmountable-a0-worker-0): FailedMount: "
    ), status["message"]
    assert 'configmap "no-such-settings" not found' in status["message"], status["message"]


# A registry on the node's loopback that never answers a pull. A TLS ClientHello gets a
# plain HTTP answer, on which containerd retries in plain HTTP (as it may for a localhost
# registry); that request is never answered. containerd gives up after 30 s here ("timeout
# awaiting response headers") and the kubelet backs off and pulls again: each attempt keeps
# the pod in ContainerCreating for 30 s with the kubelet's Pulling Event its newest, longer
# than the 10 s after which the operator looks. Nothing leaves the node's network namespace.
SILENT_REGISTRY = """
import socket, threading
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("127.0.0.1", PORT))
server.listen(16)
held = []
def serve(conn):
    first = conn.recv(1, socket.MSG_PEEK)
    if first == b"\\x16":  # a TLS ClientHello: answer in plain HTTP, so it falls back
        conn.sendall(b"HTTP/1.0 400 Bad Request\\r\\n\\r\\n")
        conn.close()
    else:
        held.append(conn)  # a plain HTTP request: never answered
while True:
    conn, _ = server.accept()
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
"""
SILENT_PORT = 5998


@pytest.mark.timeout(240)
def test_an_image_still_being_pulled_is_named_on_the_starting_job(
    release: Release, namespace: str
) -> None:
    """The pod sits Pending while the kubelet pulls: the job names its Pulling Event."""
    netns = NodeNetwork(1).netns
    script = SILENT_REGISTRY.replace("PORT", str(SILENT_PORT))
    registry = subprocess.Popen(["ip", "netns", "exec", netns, sys.executable, "-c", script])
    try:
        image = f"localhost:{SILENT_PORT}/trainwave/slow:1"
        apply(release.cluster, namespace, one_worker_job("pulling", image))
        status = status_saying(release, namespace, "pulling", "Pulling")
        assert status["phase"] == "Starting", status
        assert status["message"] == (
            f'0/1 workers running; worker 0 (pulling-a0-worker-0): Pulling: Pulling image "{image}"'
        ), status["message"]
    finally:
        registry.kill()
        registry.wait()
