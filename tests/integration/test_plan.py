"""`trainwave plan`: a dry run of gang placement against the live cluster."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "distributed-4x8.yaml"


def plan(cluster, manifest: dict, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(manifest))
    return subprocess.run(
        [sys.executable, "-m", "trainwave.cli", "plan", str(path)],
        capture_output=True, text=True, check=False, timeout=30,
        # This checkout's code, whatever checkout the cached virtualenv was installed from.
        env=os.environ | {"KUBECONFIG": str(cluster.kubeconfig), "PYTHONPATH": str(REPO / "operator")},
    )  # fmt: skip


def node_racks(cluster) -> dict[str, str]:
    nodes = yaml.safe_load(cluster.kubectl("get", "nodes", "-o", "yaml").stdout)["items"]
    return {n["metadata"]["name"]: n["metadata"]["labels"]["trainwave.io/rack"] for n in nodes}


def test_plan_places_every_rank_and_keeps_the_gang_in_one_rack(cluster, tmp_path):
    # Half a rack, so it fits in one even if earlier tests' pods are still going away.
    manifest = yaml.safe_load(EXAMPLE.read_text())
    manifest["spec"]["workers"] = 2
    result = plan(cluster, manifest, tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "2 workers x 8 GPUs" in lines[0]
    placed = [line.split("->")[1].strip() for line in lines[1:]]
    assert len(placed) == 2
    assert len(set(placed)) == 2
    assert len({node_racks(cluster)[node] for node in placed}) == 1


def test_plan_explains_a_gang_that_cannot_fit(cluster, tmp_path):
    manifest = yaml.safe_load(EXAMPLE.read_text())
    manifest["spec"]["workers"] = 9  # 72 GPUs; the small topology has 64
    result = plan(cluster, manifest, tmp_path)
    assert result.returncode == 1
    assert "cannot be placed now" in result.stdout
    assert "needs 72 GPUs (9 workers x 8)" in result.stdout


def test_plan_refuses_an_invalid_manifest_naming_the_field(cluster, tmp_path):
    manifest = yaml.safe_load(EXAMPLE.read_text())
    manifest["spec"]["workers"] = 0
    result = plan(cluster, manifest, tmp_path)
    assert result.returncode == 2
    assert "spec.workers" in result.stderr
