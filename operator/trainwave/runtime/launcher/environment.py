"""The zero-code features: what the launcher changes in the training process's environment.

Each function takes the settings and what is known about the machine and
returns the variables to set plus one state string for the log line: "on:
...", "off", or "skipped: reason". Variables the user already set are never
overwritten. Features that need the training loop's objects (AMP, fused
optimizers, DDP hooks...) are applied by prepare() and only reported here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from trainwave import contract
from trainwave.runtime.data.loader_defaults import LoaderDefaults
from trainwave.runtime.reports import NCCL_LOG_PATTERN
from trainwave.runtime.settings import Settings

# PyTorch reads this at start and forces TF32 for cuBLAS matmuls; NVIDIA's
# libraries read NVIDIA_TF32_OVERRIDE=0 and then never use TF32.
TORCH_TF32_OVERRIDE = "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE"
NVIDIA_TF32_OVERRIDE = "NVIDIA_TF32_OVERRIDE"
TF32_MIN_CAPABILITY = (8, 0)  # Ampere
LAUNCHER_FEATURES = ("tf32", "prefetch", "doctor", "telemetry", "warm_start")
# ProcessGroupNCCL's watchdog: tear the process down on a failed or timed-out
# collective, and the heartbeat monitor's limit on a stuck watchdog thread.
NCCL_ASYNC_ERROR_HANDLING = "TORCH_NCCL_ASYNC_ERROR_HANDLING"
NCCL_HEARTBEAT_TIMEOUT = "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"
NCCL_ENABLE_MONITORING = "TORCH_NCCL_ENABLE_MONITORING"


@dataclass(frozen=True)
class Machine:
    """What the launcher knows without initialising CUDA."""

    cuda: bool
    capability: tuple[int, int] | None = None  # of GPU 0, from NVML when available


@dataclass
class Prepared:
    env: dict[str, str] = field(default_factory=dict)  # variables to add for the child
    states: dict[str, str] = field(default_factory=dict)

    def set_default(self, environ: Mapping[str, str], name: str, value: str) -> bool:
        if name in environ:
            return False
        self.env[name] = value
        return True


def tf32(settings: Settings, machine: Machine, environ: Mapping[str, str], out: Prepared) -> str:
    mode = settings.feature("tf32")
    if mode == "off":
        out.set_default(environ, NVIDIA_TF32_OVERRIDE, "0")
        return "off"
    if not machine.cuda:
        return "skipped: no CUDA"
    if mode == "auto":
        if machine.capability is None:
            return "skipped: GPU compute capability unknown (no NVML); PyTorch defaults kept"
        if machine.capability < TF32_MIN_CAPABILITY:
            shown = ".".join(map(str, machine.capability))
            return f"skipped: compute capability {shown} has no TF32 (needs 8.0+)"
    out.set_default(environ, TORCH_TF32_OVERRIDE, "1")
    return f"on: {TORCH_TF32_OVERRIDE}=1 (TF32 matmuls; cuDNN convolutions use TF32 by default)"


def loader(
    settings: Settings, defaults: LoaderDefaults, environ: Mapping[str, str], out: Prepared
) -> str:
    if settings.feature("prefetch") == "off":
        return "off"
    for name, value in defaults.as_env().items():
        out.set_default(environ, name, value)
    pin = "pin_memory" if defaults.pin_memory else "no pin_memory (no CUDA)"
    return (
        f"on: {defaults.num_workers} loader workers x {defaults.fetch_threads} fetch threads, "
        f"{pin}, prefetch_factor {defaults.prefetch_factor}, persistent workers"
    )


def nccl_debug(settings: Settings, environ: Mapping[str, str], out: Prepared) -> str | None:
    """Send NCCL's INFO lines about its transport to a file the doctor reads, not to stdout."""
    if settings.feature("doctor") == "off" or contract.ENV_NCCL_DEBUG in environ:
        return None
    out.set_default(environ, contract.ENV_NCCL_DEBUG, "INFO")
    out.set_default(environ, contract.ENV_NCCL_DEBUG_SUBSYS, "INIT,NET")
    out.set_default(
        environ, contract.ENV_NCCL_DEBUG_FILE, str(settings.report_dir / NCCL_LOG_PATTERN)
    )
    return str(settings.report_dir / NCCL_LOG_PATTERN)


def collective_watchdog(settings: Settings, environ: Mapping[str, str], out: Prepared) -> str:
    """With a hang timeout, a collective stuck on a lost peer raises inside the process:
    2 x the timeout, after the launcher's watchdog (comm/process_group.py sets the same
    for the group prepare() creates). NCCL only: not verified here (no GPU)."""
    hang = settings.in_place.hang_timeout_seconds
    if hang is None:
        return "off: no hang timeout (spec.runPolicy.hangTimeoutSeconds)"
    limit = str(int(2 * hang))
    out.set_default(environ, NCCL_ASYNC_ERROR_HANDLING, "1")
    out.set_default(environ, NCCL_ENABLE_MONITORING, "1")
    out.set_default(environ, NCCL_HEARTBEAT_TIMEOUT, limit)
    return (
        f"on: {NCCL_ASYNC_ERROR_HANDLING}=1, {NCCL_HEARTBEAT_TIMEOUT}={limit} (NCCL, not "
        f"verified here); process group timeout {limit} s where prepare() creates the group"
    )


# torchrun's c10d handler shares one TCPStore, on node 0's agent, with every generation of
# training processes, unprefixed: a restarted generation's process group can read the
# previous generation's addresses and fail with "Connection refused" (pytorch/pytorch#135712,
# seen here on the real node). Not sharing it gives each rendezvous round a store of its
# own (torch/distributed/elastic/rendezvous/dynamic_rendezvous.py, next_rendezvous).
SHARE_RDZV_STORE_OFF = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"


def in_place_store(settings: Settings, environ: Mapping[str, str], out: Prepared) -> None:
    if settings.in_place.enabled:
        out.set_default(environ, SHARE_RDZV_STORE_OFF, "1")


def in_place_state(settings: Settings) -> str:
    in_place = settings.in_place
    if not in_place.enabled:
        return in_place.reason
    hang = in_place.hang_timeout_seconds
    watchdog = "no hang watchdog" if hang is None else f"hang watchdog {hang:g} s"
    return (
        f"on: torch's elastic agent over c10d, {in_place.max_restarts} restarts per "
        f"attempt; {watchdog}"
    )


def prepare(
    settings: Settings,
    machine: Machine,
    defaults: LoaderDefaults,
    environ: Mapping[str, str],
    worker_env: Mapping[str, str],
) -> Prepared:
    """Every environment change of the zero-code level, and each feature's state."""
    out = Prepared()
    # The operator's per-node choices (NCCL_IB_HCA for this node's NICs, ...)
    # are more specific than whatever the image or template set.
    out.env.update(worker_env)
    # The training process reports where the launcher reads.
    out.set_default(environ, contract.ENV_REPORT_DIR, str(settings.report_dir))
    out.states["tf32"] = tf32(settings, machine, environ, out)
    out.states["prefetch"] = loader(settings, defaults, environ, out)
    log = nccl_debug(settings, environ, out)
    if log is not None:
        out.states["nccl_debug"] = f"on: NCCL INFO lines to {log}"
    out.states["telemetry"] = (
        "off"
        if settings.feature("telemetry") == "off"
        else f"on: progress in {settings.report_dir}, served on {contract.STATUS_PATH}"
    )
    out.states["collective_watchdog"] = collective_watchdog(settings, environ, out)
    in_place_store(settings, environ, out)
    out.states["in_place"] = in_place_state(settings)
    for name in contract.RUNTIME_FEATURES:
        if name not in LAUNCHER_FEATURES:
            out.states[name] = f"{settings.feature(name)}: applied by prepare() in training"
    return out
