"""The FGD trace benchmark (tests/benchmarks/fgd_trace.py) on a small slice of the real trace.

Every 20th node of the openb cluster (61 nodes) and one seed: checks the protocol plumbing and
that the three policies run end to end through the same code the full benchmark uses. The
calibration gate needs the whole cluster and is not checked here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.fgd_trace import NODE_FILE, load_nodes, load_pods, main, trace_dir, workload
from benchmarks.operator_tasks import built_task

TRACE = trace_dir(None)

pytestmark = [
    pytest.mark.timeout(10),
    pytest.mark.skipif(
        not (TRACE / NODE_FILE).exists(),
        reason=f"trace data not found: no {NODE_FILE} in {TRACE} (set TRAINWAVE_TRACE_DIR)",
    ),
]


def test_workload_is_tuned_to_130_percent_of_the_slice() -> None:
    nodes = load_nodes(TRACE, stride=20)
    pods = load_pods(TRACE / "openb_pod_list_default.csv")
    tasks, named = workload(pods, nodes, seed=42, names="simulator")
    capacity = sum(len(n.gpu_free) for n in nodes) * 1000
    assert 1.25 * capacity < sum(t.gpu_request for t in tasks) <= 1.3 * capacity
    assert sorted(n.name.split("-", 1)[1] for n in named) == sorted(n.name for n in nodes)
    assert len({n.name[:4] for n in named}) == len(nodes), "every node gets its own prefix"
    again, _ = workload(pods, nodes, seed=42, names="simulator")
    assert again == tasks, "a seed fixes the order"


def test_three_policies_on_a_slice(tmp_path: Path) -> None:
    output = tmp_path / "fgd_trace.json"
    argv = [str(TRACE), "--variants", "default", "--seeds", "42", "--node-stride", "20"]
    assert main([*argv, "--output", str(output)]) == 0
    result = json.loads(output.read_text())
    summary = result["summary"]["default"]
    assert set(summary) == {"best-fit", "fgd", "fgd-consolidate"}
    for policy, row in summary.items():
        assert 0 <= row["unallocated_100"] < 40, policy
        assert 60 < row["allocated_130"] <= 100, policy
    assert result["gate"]["passed"] is None, "no gate on a slice"
    assert "| default |" in output.with_suffix(".md").read_text()


def test_trace_pods_become_the_tasks_the_operator_builds() -> None:
    shared = built_task(6000, 12288, 1, 460)
    assert (shared.cpu_milli, shared.memory, shared.num_gpu, shared.gpu_milli) == (
        6000, 12288 * 2**20, 1, 460,
    )  # fmt: skip
    whole = built_task(12000, 16384, 2, 1000)
    assert (whole.cpu_milli, whole.num_gpu, whole.gpu_milli) == (12000, 2, 1000)
    # The runtime's installer init container (100m, 64Mi) is the floor of a tiny pod.
    tiny = built_task(50, 0, 0, 0)
    assert (tiny.cpu_milli, tiny.memory, tiny.num_gpu) == (100, 64 * 2**20, 0)


def test_operator_task_runs_side_by_side_on_a_slice(tmp_path: Path) -> None:
    output = tmp_path / "fgd_trace.json"
    argv = [str(TRACE), "--variants", "default", "--seeds", "42", "--node-stride", "20"]
    tasks = "published,operator,operator-cpu-blind"
    assert main([*argv, "--tasks", tasks, "--output", str(output)]) == 0
    summary = json.loads(output.read_text())["summary"]
    assert set(summary) == {"default", "default [operator]", "default [operator-cpu-blind]"}
    assert set(summary["default [operator-cpu-blind]"]) == {"fgd", "fgd-consolidate"}
    # Every trace pod asks more than the installer's 100m and 64Mi but one (0 MiB, 14 CPUs,
    # a whole GPU): the operator's shapes allocate exactly as the trace's.
    for policy in ("best-fit", "fgd", "fgd-consolidate"):
        assert summary["default [operator]"][policy] == summary["default"][policy], policy
