"""tests/benchmarks/scale_measures.py QuietGate: when bench_scale lets the next phase start.
Scripted CPU readings stand in for the control plane's processes; no sleeping."""

from __future__ import annotations

import pytest

from benchmarks.scale_measures import QuietGate

pytestmark = pytest.mark.timeout(10)


def gate_over(cores: list[float], **settings: float) -> tuple[QuietGate, list[float]]:
    """A gate whose control plane uses `cores[i]` cores in its i-th window of 10 s."""
    used = iter(cores)
    total = [0.0]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        total[0] += next(used) * seconds

    return QuietGate(lambda: total[0], sleep=sleep, **settings), slept


def test_a_busy_control_plane_holds_the_phase_until_two_windows_are_near_the_floor() -> None:
    gate, slept = gate_over([1.8, 1.2, 0.4, 0.3, 0.5, 2.0])
    quiet = gate.wait()
    assert quiet["quiet"] is True
    assert quiet["cores_per_window"] == [1.8, 1.2, 0.4, 0.3]
    assert quiet["floor_cores"] == 0.3
    assert quiet["seconds"] == 40.0
    assert slept == [10.0] * 4


def test_the_floor_is_kept_across_phases() -> None:
    gate, _ = gate_over([0.2, 0.2, 0.9, 0.8, 0.5, 0.4])
    assert gate.wait()["cores_per_window"] == [0.2, 0.2]
    # 0.9 and 0.8 are idle for nobody: the run's floor is 0.2, so the next phase waits.
    assert gate.wait()["cores_per_window"] == [0.9, 0.8, 0.5, 0.4]


def test_a_control_plane_that_never_settles_starts_the_phase_at_the_timeout_and_says_so() -> None:
    gate, slept = gate_over([2.0, 0.1, 1.9, 1.9, 1.9, 1.9], timeout=40.0)
    quiet = gate.wait()
    assert quiet["quiet"] is False
    assert quiet["seconds"] == 40.0
    assert len(slept) == 4
