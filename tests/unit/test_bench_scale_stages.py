"""tests/benchmarks/scale_stages.py: a scale run's per-job seconds split at the gang's placement,
from the operator's log lines as the operator writes them."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.scale_stages import stages

pytestmark = pytest.mark.timeout(10)

LOG = """\
2026-11-29 10:00:00,500 INFO trainwave.controller.placer: bench/job-a: placed at creation: 4 workers on node-1
2026-11-29 10:00:02,000 INFO trainwave.controller.executing: bench/job-a: None -> Running (AllRunning) all 4 running
2026-11-29 10:00:03,000 INFO trainwave.controller.placer: bench/job-b: placed at creation: 4 workers on node-2
2026-11-29 10:00:05,000 INFO trainwave.controller.executing: bench/job-b: None -> Starting (Created) 0/4 running
2026-11-29 10:00:09,000 INFO trainwave.controller.executing: bench/job-b: Starting -> Running (AllRunning) all 4 running
2026-11-29 10:30:00,000 INFO trainwave.controller.placer: bench/job-a: placed at creation: a later run's
"""


def test_each_job_is_split_at_its_placement_and_the_slowest_come_first(tmp_path: Path) -> None:
    log = tmp_path / "operator.log"
    log.write_text(LOG)
    # Seconds after the apply started (10:00:00 here): created, all Running.
    run = {"trainwave": {"job_timeline": [["job-a", 0.0, 2.0], ["job-b", 1.0, 9.0]]}}
    found = stages(run, log, "09:59:59", "10:00:10")
    assert found["created_to_placed_operator"] == {"n": 2, "p50": 1.2, "p99": 2.0, "max": 2.0}
    assert found["placed_to_all_running"] == {"n": 2, "p50": 3.8, "p99": 6.0, "max": 6.0}
    assert found["bound_to_all_running_when_seen"] == {"n": 1, "p50": 4.0, "p99": 4.0, "max": 4.0}
    assert found["slowest"] == [
        {"job": "job-b", "created_to_placed": 2.0, "placed_to_all_running": 6.0},
        {"job": "job-a", "created_to_placed": 0.5, "placed_to_all_running": 1.5},
    ]


def test_a_log_without_the_runs_jobs_running_gives_nothing(tmp_path: Path) -> None:
    log = tmp_path / "operator.log"
    log.write_text(LOG)
    run = {"trainwave": {"job_timeline": [["job-c", 0.0, 2.0]]}}
    assert stages(run, log, "00:00:00", "99:99:99") == {}
