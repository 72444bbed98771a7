"""Training progress, written to the report directory for the launcher's /status.

The training loop calls `Progress.update(step, samples, loss)` every step;
a report (step, samples/s, loss, ETA, GPU utilisation and memory) is written
at most once per interval, so the cost per step is a clock read. GPU figures
come from NVML when `pynvml` (nvidia-ml-py) and a driver are present, else
the report says "skipped: no NVML".

For the goodput loop each report also holds the median wall time per step
and the median COMPUTE time per step over the window since the last report,
the process's generation (TORCHELASTIC_RESTART_COUNT: in-place restarts) and
pid. Compute time is the forward of the watched modules, timed by hooks
(`watch(module)`, which prepare() calls on the inner model and scripts without
prepare() call as `Progress.watch`), so collectives (DDP's gradient all-reduce
in backward, the script's own all_reduce) are not in it: a rank whose compute
is slower than the gang's is the straggler, the others only wait for it. On
CUDA the hooks time the kernel launches, not the kernels (no synchronize):
not verified here (no GPU).
"""

from __future__ import annotations

import os
import statistics
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainwave.runtime.reports import keep_previous, progress_path, write_json_atomic
from trainwave.runtime.settings import Settings

Clock = Callable[[], float]
# Reports whose compute_seconds each report repeats (`compute_history`); the reader
# (lifecycle/reports.py) takes no more.
COMPUTE_HISTORY = 20


@dataclass(frozen=True)
class GpuSample:
    index: int
    utilization_percent: int
    memory_used_bytes: int
    memory_total_bytes: int


class GpuReader:
    """NVML, opened lazily; `status` says why there are no samples when there are none."""

    def __init__(self) -> None:
        self.status = "on"
        self._nvml: Any = None
        self._handles: list[Any] = []
        try:
            import pynvml  # nvidia-ml-py: optional in worker images

            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            self._nvml = pynvml
        except ImportError:
            self.status = "skipped: no NVML (nvidia-ml-py not installed)"
        except Exception as error:  # NVMLError_LibraryNotFound and friends: no driver here
            self.status = f"skipped: no NVML ({type(error).__name__})"

    def sample(self) -> list[GpuSample]:
        if self._nvml is None:
            return []
        samples = []
        for index, handle in enumerate(self._handles):
            rates = self._nvml.nvmlDeviceGetUtilizationRates(handle)
            memory = self._nvml.nvmlDeviceGetMemoryInfo(handle)
            samples.append(GpuSample(index, int(rates.gpu), int(memory.used), int(memory.total)))
        return samples


class ComputeMeter:
    """Seconds spent inside the forward of watched modules, summed over the process.

    Nested watched modules (the inner model and a wrapper around it) count once.
    """

    def __init__(self, clock: Clock = time.perf_counter) -> None:
        self.total = 0.0
        self.watched = 0  # modules watched; 0: compute time is not measured
        self._clock = clock
        self._depth = 0
        self._entered = 0.0

    def enter(self) -> None:
        if self._depth == 0:
            self._entered = self._clock()
        self._depth += 1

    def leave(self) -> None:
        self._depth = max(0, self._depth - 1)
        if self._depth == 0:
            self.total += self._clock() - self._entered

    def watch(self, module: Any) -> None:
        """Time `module`'s forward (a torch.nn.Module: duck-typed, no torch import here)."""
        module.register_forward_pre_hook(lambda *_: self.enter())
        # always_call: a forward that raises still leaves, or the meter would stay inside.
        module.register_forward_hook(lambda *_: self.leave(), always_call=True)
        self.watched += 1


# One per process: prepare() and Progress.watch feed it, every Progress reads it.
METER = ComputeMeter()


def watch(module: Any) -> None:
    """Count `module`'s forward as compute time in this process's progress reports."""
    METER.watch(module)


class Progress:
    """Rate-limited progress reports for one rank."""

    def __init__(
        self,
        report_dir: Path,
        *,
        rank: int = 0,
        total_steps: int | None = None,
        interval_seconds: float = 10.0,
        clock: Clock = time.monotonic,
        wall_clock: Clock = time.time,
        gpus: Callable[[], Sequence[GpuSample]] | None = None,
        gpu_status: str | None = None,
        meter: ComputeMeter | None = None,
        generation: int | None = None,
    ) -> None:
        self.path = progress_path(report_dir, rank)
        self.rank = rank
        self.total_steps = total_steps
        self.interval = interval_seconds
        self._clock = clock
        self._wall_clock = wall_clock
        if gpus is None:
            reader = GpuReader()
            gpus, gpu_status = reader.sample, reader.status
        self._gpus = gpus
        self.gpu_status = gpu_status or "on"
        self._started = clock()
        self._last_write: float | None = None
        self._window: tuple[float, int] = (self._started, 0)  # (time, samples) at last write
        self._samples = 0
        self.writes = 0
        self._meter = METER if meter is None else meter
        self.generation = _restart_count() if generation is None else generation
        self._first_step: int | None = None
        self._last: tuple[int, float, float] | None = None  # (step, time, compute total)
        self._step_seconds: list[float] = []  # per step, since the last write
        self._compute_seconds: list[float] = []
        # The compute_seconds of the last reports, oldest first: the operator polls less
        # often than a rank reports, and judges a straggler from these (lifecycle/goodput.py).
        self._compute_history: deque[float] = deque(maxlen=COMPUTE_HISTORY)

    @classmethod
    def from_settings(cls, settings: Settings, **overrides: Any) -> Progress | None:
        if settings.feature("telemetry") == "off":
            return None
        options: dict[str, Any] = {
            "rank": settings.identity.rank,
            "total_steps": settings.total_steps,
            "interval_seconds": settings.telemetry_interval_seconds,
        }
        options.update(overrides)
        return cls(settings.report_dir, **options)

    def watch(self, module: Any) -> None:
        """Measure `module`'s forward as compute time (pass the model, not its DDP wrapper)."""
        self._meter.watch(module)

    def update(
        self, step: int, *, samples: int = 0, loss: float | None = None, force: bool = False
    ) -> bool:
        """Count `samples` more and report if the interval has passed; True when written."""
        self._samples += samples
        now = self._clock()
        self._measure(step, now)
        if not force and self._last_write is not None and now - self._last_write < self.interval:
            return False
        report = self._report(step, now, loss)
        if report["compute_seconds"]:  # positive only: the reader drops a history with a 0
            self._compute_history.append(report["compute_seconds"])
        report["compute_history"] = list(self._compute_history)
        if not self.writes:
            keep_previous(self.path.parent, self.rank)
        write_json_atomic(self.path, report)
        self._last_write = now
        self._window = (now, self._samples)
        self._step_seconds.clear()
        self._compute_seconds.clear()
        self.writes += 1
        return True

    def _measure(self, step: int, now: float) -> None:
        if self._first_step is None:
            self._first_step = step
        compute = self._meter.total
        last = self._last
        if last is not None and step > last[0]:
            steps = step - last[0]
            self._step_seconds.append((now - last[1]) / steps)
            if self._meter.watched:
                self._compute_seconds.append((compute - last[2]) / steps)
        self._last = (step, now, compute)

    def _report(self, step: int, now: float, loss: float | None) -> dict[str, Any]:
        since, samples_then = self._window
        elapsed = now - self._started
        window = now - since
        rate = (self._samples - samples_then) / window if window > 0 else None
        steps_per_second = step / elapsed if elapsed > 0 and step > 0 else None
        eta: float | None = None
        if self.total_steps is not None and steps_per_second:
            eta = max(0.0, (self.total_steps - step) / steps_per_second)
        return {
            "rank": self.rank,
            "step": step,
            "total_steps": self.total_steps,
            "samples": self._samples,
            "samples_per_second": None if rate is None else round(rate, 3),
            "loss": None if loss is None else float(loss),
            "elapsed_seconds": round(elapsed, 3),
            "eta_seconds": None if eta is None else round(eta, 1),
            "eta": "skipped: total steps unknown (TRAINWAVE_TOTAL_STEPS)"
            if self.total_steps is None
            else None,
            "gpus": [vars(gpu) for gpu in self._gpus()],
            "gpu_status": self.gpu_status,
            "time": self._wall_clock(),
            "step_seconds": _median(self._step_seconds),
            "compute_seconds": _median(self._compute_seconds),
            "generation": self.generation,
            "first_step": self._first_step,
            "pid": os.getpid(),
        }


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 6) if values else None


def _restart_count() -> int:
    """torchrun's TORCHELASTIC_RESTART_COUNT (0 outside the elastic agent)."""
    try:
        return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    except ValueError:
        return 0
