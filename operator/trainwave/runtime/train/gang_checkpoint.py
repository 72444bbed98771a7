"""Checkpoints of a whole gang, for the three-line API: one agreed step, every rank's RNG.

`Checkpointer` (checkpoint.py) writes and reads the files; a gang of ranks needs
two things on top:
- save: every rank calls it at the same step, because it gathers every rank's
  RNG state (a collective); rank 0 writes them all into the one file, so after
  a restart each rank continues its own random stream (dropout, sampling).
- resume: rank 0 picks the newest checkpoint that loads and tells the others
  its step; every rank loads exactly that one, so a torn newest file cannot
  send ranks to different steps. When any rank cannot read it, every rank
  fails with the same message: the directory must be a volume all workers share.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from trainwave import contract
from trainwave.runtime.checkpoint import Checkpointer, capture_rng


def _world() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def save_gang(
    checkpointer: Checkpointer,
    step: int,
    *,
    model: torch.nn.Module,
    optimizer: Any = None,  # Stateful; torch's own classes type their dicts narrower
    scaler: Any = None,
    sampler: object | None = None,
    extra: Mapping[str, Any] | None = None,
) -> Path | None:
    """Write checkpoint `step`; every rank calls this at the same step. Rank 0 returns the path."""
    rngs: list[Any] | None = None
    if _world() > 1:
        rngs = [None] * _world() if dist.get_rank() == 0 else None
        dist.gather_object(capture_rng(), rngs, dst=0)
    return checkpointer.save(
        step,
        model=model,
        optimizer=optimizer,
        scaler=scaler,
        sampler=sampler,
        extra=extra,
        rng_by_rank=rngs,
    )


def resume_gang(
    checkpointer: Checkpointer,
    *,
    model: torch.nn.Module,
    optimizer: Any = None,  # Stateful; torch's own classes type their dicts narrower
    scaler: Any = None,
    sampler: object | None = None,
    device: torch.device | None = None,
) -> int:
    """Load the newest checkpoint rank 0 can read on every rank; returns its step (0: none)."""
    if _world() == 1:
        return checkpointer.resume(model=model, optimizer=optimizer, scaler=scaler, sampler=sampler)
    newest = checkpointer.latest() if dist.get_rank() == 0 else None
    chosen: list[Any] = [newest.step if newest is not None else 0]
    dist.broadcast_object_list(chosen, src=0)
    step = int(chosen[0])
    if step == 0:
        return 0
    loaded = newest if newest is not None else checkpointer.load_step(step)
    ok = torch.tensor([1 if loaded is not None else 0], device=device)
    dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    if not int(ok.item()):
        raise RuntimeError(
            f"checkpoint step {step} in {checkpointer.directory} is readable on rank 0 but not "
            f"on every rank; {contract.ENV_CHECKPOINT_DIR} must be a volume every worker mounts"
        )
    assert loaded is not None
    return checkpointer.resume(
        model=model, optimizer=optimizer, scaler=scaler, sampler=sampler, loaded=loaded
    )
