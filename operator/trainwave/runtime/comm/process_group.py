"""Joining the job's default process group from the environment, as Accelerate does.

torchrun and trainwave's pods set MASTER_ADDR, MASTER_PORT, RANK and
WORLD_SIZE; a script that calls `prepare()` should not also have to call
`init_process_group`. So when WORLD_SIZE > 1 and no group exists, `prepare()`
joins one over env://: NCCL when this process has a CUDA device, gloo without.
A group the script created itself is left alone.

With a hang timeout (spec.runPolicy.hangTimeoutSeconds) the group's collective
timeout is twice it (`collective_timeout`), so a collective stuck on a lost or
stopped peer raises inside the process (gloo honours the timeout; NCCL through
its watchdog, not verified here) after the launcher's hang watchdog has had
its chance to restart the gang in place, as a backstop when it cannot.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import timedelta

import torch
import torch.distributed as dist

from trainwave import contract
from trainwave.runtime.settings import Settings


def join_from_env(
    settings: Settings, device: torch.device, environ: Mapping[str, str] | None = None
) -> str | None:
    """Join the default group when the job has several ranks; the report, None if single."""
    identity = settings.identity
    if identity.world_size <= 1:
        return None
    if dist.is_initialized():
        return f"on: the script's own group ({dist.get_backend()}, {dist.get_world_size()} ranks)"
    env = os.environ if environ is None else environ
    missing = [n for n in (contract.ENV_MASTER_ADDR, contract.ENV_MASTER_PORT) if not env.get(n)]
    if missing:
        raise ValueError(
            f"{contract.ENV_WORLD_SIZE}={identity.world_size} but {' and '.join(missing)} "
            "not set: start the script with torchrun or in a trainwave worker, or call "
            "torch.distributed.init_process_group before prepare()"
        )
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)  # NCCL binds each rank to the device current at init
    timeout = collective_timeout(settings)
    dist.init_process_group(
        backend,
        init_method="env://",
        rank=identity.rank,
        world_size=identity.world_size,
        timeout=timeout,  # None: torch's default
    )
    shown = "" if timeout is None else f", collective timeout {timeout.total_seconds():g} s"
    return (
        f"on: {backend} over env:// ({env[contract.ENV_MASTER_ADDR]}:"
        f"{env[contract.ENV_MASTER_PORT]}), rank {identity.rank} of {identity.world_size}{shown}"
    )


def collective_timeout(settings: Settings) -> timedelta | None:
    """2 x the hang timeout; None (torch's default) without one."""
    hang = settings.in_place.hang_timeout_seconds
    return None if hang is None else timedelta(seconds=2 * hang)
