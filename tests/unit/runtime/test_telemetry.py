"""Progress reports: rate limit, samples/s, ETA, GPU figures or the reason there are none."""

from __future__ import annotations

import json
from pathlib import Path

from trainwave.runtime.reports import latest_progress
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
