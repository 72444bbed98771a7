"""Progress reports: rate limit, samples/s, ETA, GPU figures or the reason there are none."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainwave.runtime.reports import PREVIOUS_PREFIX, all_progress, latest_progress
from trainwave.runtime.settings import load_settings
from trainwave.runtime.telemetry import GpuReader, GpuSample, Progress


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make_progress(tmp_path: Path, clock: FakeClock, **options: object) -> Progress:
    gpus = [GpuSample(0, 87, 30 << 30, 80 << 30)]
    return Progress(tmp_path, clock=clock, wall_clock=lambda: 1.7e9, gpus=lambda: gpus, **options)  # type: ignore[arg-type]


def read(progress: Progress) -> dict[str, object]:
    return json.loads(progress.path.read_text())


def test_writes_at_most_once_per_interval(tmp_path: Path) -> None:
    clock = FakeClock()
    progress = make_progress(tmp_path, clock, interval_seconds=10.0)
    written = []
    for step in range(1, 101):
        clock.now += 0.5
        written.append(progress.update(step, samples=32))
    assert progress.writes == 5  # t = 0.5 (first), 10.5, 20.5, 30.5, 40.5 s
    assert written.index(True) == 0
    assert read(progress)["step"] == 81


def test_rates_eta_loss_and_gpus(tmp_path: Path) -> None:
    clock = FakeClock()
    progress = make_progress(tmp_path, clock, total_steps=1000, interval_seconds=0.0)
    clock.now += 10
    progress.update(100, samples=3200, loss=2.5)
    report = read(progress)
    assert report["samples_per_second"] == 320.0
    assert report["eta_seconds"] == 90.0  # 900 steps left at 10 steps/s
    assert report["loss"] == 2.5
    assert report["gpus"] == [
        {
            "index": 0,
            "utilization_percent": 87,
            "memory_used_bytes": 30 << 30,
            "memory_total_bytes": 80 << 30,
        }
    ]
    assert report["eta"] is None


def test_without_total_steps_eta_says_why(tmp_path: Path) -> None:
    clock = FakeClock()
    progress = make_progress(tmp_path, clock, interval_seconds=0.0)
    clock.now += 1
    progress.update(5, samples=10)
    assert read(progress)["eta_seconds"] is None
    assert "TRAINWAVE_TOTAL_STEPS" in str(read(progress)["eta"])


def test_no_nvml_here_is_reported_as_skipped(tmp_path: Path) -> None:
    reader = GpuReader()
    if reader.status == "on":  # a machine with a driver: the reader must then sample
        assert reader.sample()
        return
    assert reader.status.startswith("skipped: no NVML")
    assert reader.sample() == []
    progress = Progress(tmp_path, interval_seconds=0.0)
    progress.update(1)
    assert read(progress)["gpu_status"] == reader.status


def test_launcher_reads_the_lowest_rank(tmp_path: Path) -> None:
    clock = FakeClock()
    for rank in (3, 1):
        make_progress(tmp_path, clock, rank=rank).update(rank * 10, force=True)
    report = latest_progress(tmp_path)
    assert report is not None
    assert report["rank"] == 1


def test_from_settings_respects_the_feature_switch(tmp_path: Path) -> None:
    assert Progress.from_settings(load_settings({"TRAINWAVE_FEATURE_TELEMETRY": "off"})) is None
    env = {"TRAINWAVE_REPORT_DIR": str(tmp_path), "RANK": "2", "TRAINWAVE_TOTAL_STEPS": "50"}
    progress = Progress.from_settings(load_settings(env), gpus=list, gpu_status="skipped: test")
    assert progress is not None
    assert (progress.path.parent, progress.rank, progress.total_steps) == (tmp_path, 2, 50)


# --- the goodput loop's figures: step and compute time, generation ----------------------


class FakeModule:
    """What ComputeMeter.watch needs of a torch module: its two hook registrations."""

    def __init__(self) -> None:
        self.pre: list[object] = []
        self.post: list[object] = []

    def register_forward_pre_hook(self, hook: object) -> None:
        self.pre.append(hook)

    def register_forward_hook(self, hook: object, *, always_call: bool = False) -> None:
        assert always_call, "a forward that raises must still leave the meter"
        self.post.append(hook)

    def forward(self, clock: FakeClock, seconds: float) -> None:
        for hook in self.pre:
            hook()  # type: ignore[operator]
        clock.now += seconds
        for hook in self.post:
            hook()  # type: ignore[operator]


def test_step_and_compute_seconds_are_medians_over_the_window(tmp_path: Path) -> None:
    from trainwave.runtime.telemetry import ComputeMeter

    clock = FakeClock()
    meter = ComputeMeter(clock=clock)
    progress = make_progress(tmp_path, clock, interval_seconds=5.0, meter=meter, generation=2)
    model = FakeModule()
    progress.watch(model)
    progress.update(10)  # the first call writes; no step time yet
    assert read(progress)["step_seconds"] is None
    for step, (forward, wait) in enumerate([(0.1, 0.3), (0.2, 0.2), (0.1, 0.5), (0.9, 0.1)], 11):
        model.forward(clock, forward)
        clock.now += wait  # backward and the all-reduce: not compute
        progress.update(step, force=step == 14)
    report = read(progress)
    assert report["step_seconds"] == pytest.approx(0.5)  # median of 0.4, 0.4, 0.6, 1.0
    assert report["compute_seconds"] == pytest.approx(0.15)  # median of 0.1, 0.2, 0.1, 0.9
    assert report["generation"] == 2
    assert report["first_step"] == 10
    assert report["compute_history"] == [pytest.approx(0.15)]  # the first write had none
    assert report["pid"] > 0


def test_compute_history_keeps_the_last_reports_oldest_first(tmp_path: Path) -> None:
    from trainwave.runtime.telemetry import COMPUTE_HISTORY, ComputeMeter

    clock = FakeClock()
    meter = ComputeMeter(clock=clock)
    progress = make_progress(tmp_path, clock, interval_seconds=0.0, meter=meter)
    model = FakeModule()
    progress.watch(model)
    progress.update(0)
    forwards = [0.01 * (n + 1) for n in range(COMPUTE_HISTORY + 5)]
    for step, forward in enumerate(forwards, 1):
        model.forward(clock, forward)
        progress.update(step)
    history = read(progress)["compute_history"]
    assert history == pytest.approx(forwards[-COMPUTE_HISTORY:])
    assert read(progress)["compute_seconds"] == pytest.approx(forwards[-1])


def test_compute_is_null_when_no_module_is_watched(tmp_path: Path) -> None:
    from trainwave.runtime.telemetry import ComputeMeter

    clock = FakeClock()
    progress = make_progress(tmp_path, clock, interval_seconds=0.0, meter=ComputeMeter(clock))
    progress.update(1)
    clock.now += 0.5
    progress.update(2)
    assert read(progress)["step_seconds"] == 0.5
    assert read(progress)["compute_seconds"] is None


def test_nested_watched_modules_count_once() -> None:
    from trainwave.runtime.telemetry import ComputeMeter

    clock = FakeClock()
    meter = ComputeMeter(clock=clock)
    outer, inner = FakeModule(), FakeModule()
    meter.watch(outer)
    meter.watch(inner)
    for hook in outer.pre:
        hook()  # type: ignore[operator]
    inner.forward(clock, 0.25)
    clock.now += 0.25
    for hook in outer.post:
        hook()  # type: ignore[operator]
    assert meter.total == pytest.approx(0.5)


def test_generation_is_torchs_restart_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "3")
    assert make_progress(tmp_path, FakeClock()).generation == 3


def test_a_new_process_moves_its_ranks_last_report_aside(tmp_path: Path) -> None:
    """So the launcher can still read the last step of the generation before (restarts.py)."""
    clock = FakeClock()
    old = make_progress(tmp_path, clock, rank=3, interval_seconds=0.0)
    old.update(9, force=True)
    new = make_progress(tmp_path, clock, rank=3, interval_seconds=0.0)
    new.update(5, force=True)
    new.update(6, force=True)  # later writes leave the kept report alone
    kept = all_progress(tmp_path, PREVIOUS_PREFIX)
    assert list(kept) == [3]
    assert kept[3]["step"] == 9
    assert all_progress(tmp_path)[3]["step"] == 6
    assert (tmp_path / "previous-rank3.json").exists()
