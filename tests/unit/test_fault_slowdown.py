"""The fault benchmark's slowed rank: which cgroup holds it and what quota halves its CPU."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from benchmarks.fault_injection import MIN_QUOTA_US, cpu_cgroup_path, cpu_seconds, half_quota_us
from benchmarks.fault_worker import process_started_at

pytestmark = pytest.mark.timeout(10)

V1 = """12:pids:/kubepods/pod1/abc
4:memory:/kubepods/pod1/abc
3:cpu,cpuacct:/kubepods/besteffort/pod1/abc
0::/
"""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(V1, "/kubepods/besteffort/pod1/abc", id="cpu-and-cpuacct-together"),
        pytest.param("2:cpuacct:/x\n1:cpu:/y\n", "/y", id="cpu-alone"),
    ],
)
def test_the_cpu_hierarchy_is_found(text: str, expected: str) -> None:
    assert cpu_cgroup_path(text) == expected


def test_a_v2_only_host_is_refused_with_a_reason() -> None:
    with pytest.raises(ValueError, match="cpu controller"):
        cpu_cgroup_path("0::/user.slice\n")


@pytest.mark.parametrize(
    ("cpu", "wall", "period", "expected"),
    [
        pytest.param(1.0, 2.0, 20_000, 5_000, id="half-of-half-a-cpu"),
        pytest.param(2.0, 2.0, 20_000, 10_000, id="half-of-a-whole-cpu"),
        pytest.param(0.05, 2.0, 20_000, MIN_QUOTA_US, id="the-kernel-floor"),
    ],
)
def test_the_quota_is_half_the_share_used(
    cpu: float, wall: float, period: int, expected: int
) -> None:
    assert half_quota_us(cpu, wall, period) == expected


def test_no_wall_time_is_an_error_naming_it() -> None:
    with pytest.raises(ValueError, match="wall_seconds"):
        half_quota_us(1.0, 0.0, 20_000)


def test_cpu_and_start_times_are_read_from_proc(tmp_path: Path) -> None:
    (tmp_path / "42").mkdir()
    # pid (comm with ) and spaces) state ppid ... utime=14th stime=15th starttime=22nd field
    fields = ["S", "1"] + ["0"] * 9 + ["300", "100"] + ["0"] * 6 + ["5000"]
    (tmp_path / "42" / "stat").write_text("42 (a ) b) " + " ".join(fields) + "\n")
    (tmp_path / "uptime").write_text("1000.00 1800.00\n")
    ticks = 100  # SC_CLK_TCK on Linux
    assert cpu_seconds(42, tmp_path) == pytest.approx(400 / ticks)
    started = process_started_at(42, tmp_path)
    assert started is not None
    assert time.time() - started == pytest.approx(1000.0 - 5000 / ticks, abs=1.0)
