"""Checkpoints that survive a crash at any instant, and resuming from the newest good one.

A checkpoint is written to a temp file in the target directory, flushed and
fsynced, renamed over its final name, and the directory is fsynced so the
rename itself is durable. A process killed mid-write therefore leaves a temp
file (ignored, removed by the next save) and never a half-written
`step-*.pt`. A file that is torn anyway (a filesystem without atomic rename,
a damaged disk) fails to load and `latest()` falls back to the one before.

Only rank 0 writes: with DDP every rank holds the same weights. Every rank
loads, so all of them resume at the same step with the same state.
"""

from __future__ import annotations

import os
import random
import re
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from trainwave.runtime.settings import Settings

FORMAT = "trainwave-checkpoint/1"
_NAME = re.compile(r"^step-(\d{12})\.pt$")
_TEMP_PREFIX = ".partial-"


class Stateful(Protocol):
    def state_dict(self) -> Mapping[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any], /) -> Any: ...


@dataclass(frozen=True)
class Loaded:
    path: Path
    step: int
    state: Mapping[str, Any]


def checkpoint_name(step: int) -> str:
    return f"step-{step:012d}.pt"


def list_checkpoints(directory: Path) -> list[tuple[int, Path]]:
    """Complete-looking checkpoints (by name), oldest first; temp files are not listed."""
    if not directory.is_dir():
        return []
    found = []
    for path in directory.iterdir():
        match = _NAME.match(path.name)
        if match is not None:
            found.append((int(match.group(1)), path))
    return sorted(found)


def write_atomic(path: Path, state: Mapping[str, Any]) -> None:
    """torch.save to `path` so that `path` is either absent, the old file, or complete."""
    handle, temp = tempfile.mkstemp(prefix=_TEMP_PREFIX, suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as stream:
            torch.save(dict(state), stream)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    _fsync_directory(path.parent)


def _fsync_directory(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def load_valid(path: Path, map_location: str | torch.device = "cpu") -> Mapping[str, Any] | None:
    """The checkpoint's contents, or None when it is torn, foreign or unreadable."""
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception:  # a torn zip raises RuntimeError; a foreign pickle, UnpicklingError
        return None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        return None
    return state if isinstance(state.get("step"), int) else None


def capture_rng() -> dict[str, Any]:
    rng: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    return rng


def restore_rng(rng: Mapping[str, Any]) -> None:
    torch.set_rng_state(rng["torch"])
    version, internal, gauss = rng["python"]
    # weights_only loading turns the state's inner tuple into a list
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])


def _unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    # DDP and torch.compile wrap the user's module; save the inner one so the
    # checkpoint loads into a plain model too.
    inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
    return inner if isinstance(inner, torch.nn.Module) else model


class Checkpointer:
    """Save every N steps into one directory, keep the newest K, resume from the newest good."""

    def __init__(
        self, directory: Path, *, keep: int = 3, every_steps: int | None = None, rank: int = 0
    ) -> None:
        if keep < 1:
            raise ValueError(f"keep={keep}: expected at least 1 checkpoint to keep")
        self.directory = directory
        self.keep = keep
        self.every_steps = every_steps
        self.rank = rank

    @classmethod
    def from_settings(cls, settings: Settings) -> Checkpointer | None:
        """None when no checkpoint directory is configured or the feature is off."""
        if settings.checkpoint_dir is None or settings.feature("checkpoint") == "off":
            return None
        return cls(
            settings.checkpoint_dir,
            keep=settings.checkpoint_keep,
            every_steps=settings.checkpoint_every_steps,
            rank=settings.identity.rank,
        )

    def due(self, step: int) -> bool:
        return self.every_steps is not None and step > 0 and step % self.every_steps == 0

    def save(
        self,
        step: int,
        *,
        model: torch.nn.Module,
        optimizer: Stateful | None = None,
        scaler: Stateful | None = None,
        sampler: object | None = None,
        extra: Mapping[str, Any] | None = None,
        rng_by_rank: Sequence[Mapping[str, Any]] | None = None,
    ) -> Path | None:
        """Write checkpoint `step` (rank 0 only); returns its path, None on other ranks.

        `rng_by_rank`: every rank's RNG state (gang_checkpoint gathers them), so
        each rank resumes its own random stream, not rank 0's.
        """
        if self.rank != 0:
            return None
        self.directory.mkdir(parents=True, exist_ok=True)
        state: dict[str, Any] = {
            "format": FORMAT,
            "step": step,
            "model": _unwrapped(model).state_dict(),
            "rng": capture_rng(),
        }
        if optimizer is not None:
            state["optimizer"] = optimizer.state_dict()
        if scaler is not None:
            state["scaler"] = scaler.state_dict()
        sampler_state = getattr(sampler, "state_dict", None)
        if callable(sampler_state):
            state["sampler"] = sampler_state()
        if extra:
            state["extra"] = dict(extra)
        if rng_by_rank is not None:
            state["rng_by_rank"] = [dict(r) for r in rng_by_rank]
        self._remove_partials()
        path = self.directory / checkpoint_name(step)
        write_atomic(path, state)
        self._prune()
        return path

    def latest(self, map_location: str | torch.device = "cpu") -> Loaded | None:
        """The newest checkpoint that loads; torn or foreign files are skipped."""
        for step, path in reversed(list_checkpoints(self.directory)):
            state = load_valid(path, map_location)
            if state is not None and state["step"] == step:
                return Loaded(path, step, state)
        return None

    def load_step(self, step: int, map_location: str | torch.device = "cpu") -> Loaded | None:
        """Checkpoint `step` exactly, or None when it is missing or does not load."""
        path = self.directory / checkpoint_name(step)
        state = load_valid(path, map_location) if path.is_file() else None
        if state is None or state["step"] != step:
            return None
        return Loaded(path, step, state)

    def resume(
        self,
        *,
        model: torch.nn.Module,
        optimizer: Stateful | None = None,
        scaler: Stateful | None = None,
        sampler: object | None = None,
        map_location: str | torch.device = "cpu",
        loaded: Loaded | None = None,
    ) -> int:
        """Restore all from `loaded` or the newest good checkpoint; returns its step (0: none)."""
        loaded = loaded or self.latest(map_location)
        if loaded is None:
            return 0
        state = loaded.state
        _unwrapped(model).load_state_dict(state["model"])
        if optimizer is not None and "optimizer" in state:
            optimizer.load_state_dict(state["optimizer"])
        if scaler is not None and "scaler" in state:
            scaler.load_state_dict(state["scaler"])
        sampler_load = getattr(sampler, "load_state_dict", None)
        if callable(sampler_load) and "sampler" in state:
            sampler_load(state["sampler"])
        own = state.get("rng_by_rank")
        restore_rng(own[self.rank] if own and self.rank < len(own) else state["rng"])
        return loaded.step

    def _prune(self) -> None:
        complete = list_checkpoints(self.directory)
        for _, path in complete[: max(0, len(complete) - self.keep)]:
            path.unlink(missing_ok=True)

    def _remove_partials(self) -> None:
        # Only rank 0 writes here, so any temp file is a leftover of a crash.
        for path in self.directory.glob(f"{_TEMP_PREFIX}*.tmp"):
            path.unlink(missing_ok=True)
