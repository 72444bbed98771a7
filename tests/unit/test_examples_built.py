"""The manifests in examples/, through the operator's pure core: each is a spec resolve()
accepts, and the builders make its workers as written. tests/integration/test_examples.py
applies them to the real control plane and waits for each outcome; what the builders alone
decide is checked here, without a cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from trainwave import contract
from trainwave.builders.pods import build_worker_pods
from trainwave.resolving import resolve

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def stored(path: Path) -> dict[str, Any]:
    """The manifest as the API server would hand it to the operator."""
    manifest = yaml.safe_load(path.read_text())
    metadata = {"namespace": "default", "uid": "0123456789abcdef", **manifest["metadata"]}
    return {**manifest, "metadata": metadata}


def rank_zero(path: Path) -> dict[str, Any]:
    resolved = resolve(stored(path))
    [pod] = build_worker_pods(resolved, (0,), resolved.job.status.attempt)
    return pod


def worker_env(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    [worker] = [c for c in pod["spec"]["containers"] if c["name"] == contract.WORKER_CONTAINER]
    return {e["name"]: e for e in worker["env"]}


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_resolves_and_builds_its_workers_as_written(path: Path) -> None:
    spec = yaml.safe_load(path.read_text())["spec"]
    pod = rank_zero(path)
    [worker] = [c for c in pod["spec"]["containers"] if c["name"] == contract.WORKER_CONTAINER]
    assert worker["image"] == spec["image"]
    assert spec["command"][-1] in " ".join(worker["command"] + worker.get("args", []))


def test_the_shared_example_is_pinned_and_budgeted_as_written() -> None:
    """Moved from the integration test of the same name: the pod's env is the builders'."""
    env = worker_env(rank_zero(EXAMPLES / "shared-gpu-finetune.yaml"))
    for name in ("NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"):
        assert env[name]["valueFrom"]["fieldRef"]["fieldPath"] == (
            "metadata.annotations['trainwave.io/gpu-uuid']"
        )
    assert int(env["TRAINWAVE_GPU_MEMORY_BUDGET_BYTES"]["value"]) == 6656 << 20
    assert env["TRAINWAVE_FEATURE_SUBMODEL"]["value"] == "auto"
