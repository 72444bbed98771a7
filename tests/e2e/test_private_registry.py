"""Images pulled from a private registry, as on a user's cluster.

The cluster's registry (tests/cluster/realnode_registry.py: distribution's server, TLS from
the cluster CA, basic auth) holds every `make images` image. The release was installed with
the registry host prefixed to the chart's repositories and a pull secret
(`imagePullSecrets`), as values.yaml tells a user to; a job names its worker and runtime
images in the same registry with a pull secret of its own namespace, in its pod template.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from cluster import realnode_registry
from cluster.deploy import CHART, PULL_SECRET, helm
from e2e.conftest import RUNTIME_IMAGE, WORKER_IMAGE, Release
from e2e.test_stuck_worker import status_saying
from e2e.test_training import training_job
from integration.trainwave_fixtures import apply, get_json, wait_for_phase
from trainwave import contract


def registry(release: Release) -> realnode_registry.RegistryFiles:
    return realnode_registry.files(release.cluster.state_dir)


def pulled_from_registry(release: Release, status: dict[str, Any], *, latest: bool) -> None:
    """The container runs an image pulled from the registry (its id is the registry's
    repository and a digest); with `latest`, the one last pushed under its tag."""
    image = status["image"]
    digest = realnode_registry.pushed_digest(registry(release), image)
    repository = image.rsplit(":", 1)[0]
    assert digest, f"{image} was never pushed to the cluster's registry"
    assert status["imageID"].startswith(f"{repository}@sha256:"), status
    if latest:
        assert status["imageID"] == f"{repository}@{digest}", status


def test_the_release_runs_images_pulled_from_the_private_registry(release: Release) -> None:
    pods = [*release.operator_pods(), release.agent_pod()]
    for pod in pods:
        assert pod["spec"]["imagePullSecrets"] == [{"name": PULL_SECRET}], pod["spec"]
        for status in pod["status"]["containerStatuses"]:
            assert status["image"].startswith(f"{realnode_registry.HOST}/trainwave/"), status
            pulled_from_registry(release, status, latest=True)  # pulled `Always`


def test_the_release_came_from_the_chart_published_to_the_registry(release: Release) -> None:
    """The fixture packaged this tree's chart, pushed it and installed it from `oci://`:
    what the registry serves is that chart, and the release runs its version."""
    shown = helm(release.cluster, "show", "chart", release.chart, *release.pull)
    assert shown.returncode == 0, shown.stderr
    published = yaml.safe_load(shown.stdout)
    tree = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert (published["name"], published["version"]) == (tree["name"], tree["version"])
    listed = helm(release.cluster, "list", "-n", release.namespace, "-o", "json")
    (installed,) = json.loads(listed.stdout)
    assert installed["chart"] == f"{tree['name']}-{tree['version']}", installed


def registry_job(name: str, checkpoints: Path, *, pull_secret: str | None) -> dict[str, Any]:
    """test_training's DDP job (2 workers x 2 processes, the runtime injected), its worker
    and runtime images from the registry, the worker's pulled on every start."""
    manifest = training_job(name, checkpoints, steps=4, every=2)
    spec = manifest["spec"]
    spec["image"] = realnode_registry.registry_ref(WORKER_IMAGE)
    spec["imagePullPolicy"] = "Always"
    spec["runtime"]["image"] = realnode_registry.registry_ref(RUNTIME_IMAGE)
    if pull_secret:
        spec["template"]["spec"]["imagePullSecrets"] = [{"name": pull_secret}]
    return manifest


@pytest.mark.timeout(420)
def test_a_job_pulls_its_worker_and_runtime_images_with_its_pull_secret(
    release: Release, namespace: str, tmp_path: Path
) -> None:
    cluster = release.cluster
    secret = realnode_registry.pull_secret(registry(release), "registry", namespace)
    apply(cluster, namespace, secret)
    apply(cluster, namespace, registry_job("pulled", tmp_path, pull_secret="registry"))

    done = wait_for_phase(cluster, namespace, "pulled", ("Succeeded", "Failed"), timeout=360)

    assert done["status"]["phase"] == "Succeeded", done["status"]
    selector = f"{contract.LABEL_JOB_NAME}=pulled"
    pods = get_json(cluster, namespace, "pods", "-l", selector)["items"]
    assert pods
    for pod in pods:
        (worker,) = (s for s in pod["status"]["containerStatuses"]
                     if s["name"] == contract.WORKER_CONTAINER)  # fmt: skip
        (installer,) = (s for s in pod["status"]["initContainerStatuses"]
                        if s["name"] == contract.RUNTIME_INIT_CONTAINER)  # fmt: skip
        pulled_from_registry(release, worker, latest=True)
        # `IfNotPresent`: on a cluster kept across `make images`, an earlier pull of the tag.
        pulled_from_registry(release, installer, latest=False)
    # `Always`: the kubelet pulled the worker image for each pod, credentials and all.
    events = get_json(cluster, namespace, "events", "--field-selector", "reason=Pulled")
    pulled = [e["message"] for e in events["items"]]
    worker_image = realnode_registry.registry_ref(WORKER_IMAGE)
    assert sum(f'Successfully pulled image "{worker_image}"' in m for m in pulled) >= len(pods), (
        pulled
    )


@pytest.mark.timeout(240)
def test_a_job_without_the_pull_secret_names_the_refused_pull(
    release: Release, namespace: str, tmp_path: Path
) -> None:
    """The registry refuses an anonymous pull; the job's message names the worker, the image
    and the kubelet's reason, and the job waits. Only a pull checks credentials: the runtime
    image, if an earlier pod put it on the node, starts (`IfNotPresent`); the worker's image
    is pulled on every start (`Always`) and refused."""
    cluster = release.cluster
    apply(cluster, namespace, registry_job("anonymous", tmp_path, pull_secret=None))

    status = status_saying(
        release, namespace, "anonymous", "ErrImagePull", "ImagePullBackOff", "Failed to pull"
    )

    assert status["phase"] == "Starting", status
    message = status["message"]
    assert "worker 0 (anonymous-a0-worker-0): " in message, message
    assert f'"{realnode_registry.HOST}/trainwave/' in message, message
