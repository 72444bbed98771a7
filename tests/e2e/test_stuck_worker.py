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

from typing import Any

import pytest

from e2e.conftest import ON_REAL_NODE, WORKER_IMAGE, Release
from integration.trainwave_fixtures import apply, job, job_manifest, wait_until

MISSING_IMAGE = "localhost:5999/trainwave/missing:1"


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
    manifest = job_manifest(
        "unpullable",
        workers=1,
        gpus=1,
        result=None,
        image=MISSING_IMAGE,
        template_spec={"nodeSelector": ON_REAL_NODE},
    )
    apply(cluster, namespace, manifest)

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
