"""The runtime's settings, parsed once from the TRAINWAVE_* environment.

The operator writes these variables (names in `trainwave.contract`); a user
may set them in the job's env too. Parsing is strict: a value the runtime
would otherwise misread raises `SettingsError` naming the variable, the
value seen and what is accepted, so a typo fails the worker at start instead
of silently switching a feature off. Every other runtime module reads its
knobs from the frozen `Settings` this returns.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from trainwave import contract

_T = TypeVar("_T")

DEFAULT_CHECKPOINT_KEEP = 3
DEFAULT_TELEMETRY_INTERVAL_SECONDS = 10.0
# Where reports go when the operator did not choose: every process of the pod
# sees the same /tmp, and the launcher exports the choice to its child.
DEFAULT_REPORT_DIR = Path(tempfile.gettempdir()) / "trainwave"
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


class SettingsError(ValueError):
    """A TRAINWAVE_* variable holds a value the runtime does not accept."""


@dataclass(frozen=True)
class Identity:
    """Who this process is in the job: torch's own variables plus the job's name."""

    job_name: str | None = None
    namespace: str | None = None
    attempt: int | None = None
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    node_rank: int = 0
    nproc_per_node: int = 1


@dataclass(frozen=True)
class LoaderOverrides:
    """Data-loader defaults set in the environment (None: the runtime decides)."""

    num_workers: int | None = None
    pin_memory: bool | None = None
    persistent_workers: bool | None = None
    prefetch_factor: int | None = None
    fetch_threads: int | None = None


@dataclass(frozen=True)
class InPlace:
    """In-place restarts: torch's elastic agent over c10d, and the hang watchdog.

    On when the operator gave the worker the c10d rendezvous and a restart budget
    (builders/runtime.py in_place_env); `reason` says why not otherwise.
    """

    enabled: bool = False
    max_restarts: int = 0
    hang_timeout_seconds: float | None = None
    reason: str = ""
    # is_host in PET_RDZV_CONF: this worker's agent serves the rendezvous store (worker 0)
    hosts_store: bool = False
    # The other workers' addresses (TRAINWAVE_WORKER_ADDRESS for each rank of PET_NNODES):
    # where the store's host announces its address (launcher/announce.py).
    peers: tuple[str, ...] = ()
    # TRAINWAVE_REPLACEMENT: this pod replaces its worker alone in a running gang.
    replacement: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "enabled": self.enabled,
            "max_restarts": self.max_restarts,
            "hang_timeout_seconds": self.hang_timeout_seconds,
            "hosts_store": self.hosts_store,
            "peers": len(self.peers),
            "replacement": self.replacement,
            "reason": self.reason,
        }


@dataclass(frozen=True)
class Settings:
    """Everything the runtime reads from its environment, validated."""

    features: Mapping[str, str] = field(default_factory=dict)
    identity: Identity = field(default_factory=Identity)
    checkpoint_dir: Path | None = None
    checkpoint_every_steps: int | None = None
    checkpoint_keep: int = DEFAULT_CHECKPOINT_KEEP
    report_dir: Path = DEFAULT_REPORT_DIR
    status_host: str = contract.DEFAULT_STATUS_HOST
    status_port: int = contract.DEFAULT_STATUS_PORT
    status_key_file: Path | None = None
    podinfo_dir: Path | None = None
    inter_node_gbps: float | None = None
    intra_node_gbps: float | None = None
    gpu_memory_budget_bytes: int | None = None
    arbiter_socket: str | None = None
    loader: LoaderOverrides = field(default_factory=LoaderOverrides)
    total_steps: int | None = None
    telemetry_interval_seconds: float = DEFAULT_TELEMETRY_INTERVAL_SECONDS
    in_place: InPlace = field(default_factory=InPlace)

    def feature(self, name: str) -> str:
        """The mode of one feature: "on", "off", "auto" (compression: or its algorithm)."""
        if name not in contract.RUNTIME_FEATURES:
            raise KeyError(
                f"feature {name!r} is unknown; known: {', '.join(contract.RUNTIME_FEATURES)}"
            )
        return self.features.get(name, "auto")

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready view, for the launcher's one log line of effective settings."""
        return {
            "features": {name: self.feature(name) for name in contract.RUNTIME_FEATURES},
            "identity": vars(self.identity),
            "checkpoint": {
                "dir": _str_or_none(self.checkpoint_dir),
                "every_steps": self.checkpoint_every_steps,
                "keep": self.checkpoint_keep,
            },
            "report_dir": str(self.report_dir),
            "status": f"{self.status_host}:{self.status_port}",
            "status_key_file": _str_or_none(self.status_key_file),
            "podinfo_dir": _str_or_none(self.podinfo_dir),
            "topology": {"inter_node_gbps": self.inter_node_gbps},
            "gpu_memory_budget_bytes": self.gpu_memory_budget_bytes,
            "arbiter_socket": self.arbiter_socket,
            "loader": vars(self.loader),
            "total_steps": self.total_steps,
            "in_place": self.in_place.as_dict(),
        }


def load_settings(environ: Mapping[str, str]) -> Settings:
    """Parse the runtime's settings from an environment mapping (usually os.environ)."""
    env = _Reader(environ)
    return Settings(
        features=_features(environ),
        identity=Identity(
            job_name=env.text(contract.ENV_JOB_NAME),
            namespace=env.text(contract.ENV_JOB_NAMESPACE),
            attempt=env.integer(contract.ENV_ATTEMPT, minimum=0),
            rank=env.integer(contract.ENV_RANK, minimum=0) or 0,
            local_rank=env.integer(contract.ENV_LOCAL_RANK, minimum=0) or 0,
            world_size=env.integer(contract.ENV_WORLD_SIZE, minimum=1) or 1,
            local_world_size=env.integer(contract.ENV_LOCAL_WORLD_SIZE, minimum=1) or 1,
            node_rank=env.integer(contract.ENV_NODE_RANK, minimum=0) or 0,
            nproc_per_node=env.integer(contract.ENV_PET_NPROC_PER_NODE, minimum=1) or 1,
        ),
        checkpoint_dir=env.path(contract.ENV_CHECKPOINT_DIR),
        checkpoint_every_steps=env.integer(contract.ENV_CHECKPOINT_EVERY_STEPS, minimum=1),
        checkpoint_keep=env.integer(contract.ENV_CHECKPOINT_KEEP, minimum=1)
        or DEFAULT_CHECKPOINT_KEEP,
        report_dir=env.path(contract.ENV_REPORT_DIR) or DEFAULT_REPORT_DIR,
        status_host=env.text(contract.ENV_STATUS_HOST) or contract.DEFAULT_STATUS_HOST,
        status_port=_port(env),
        status_key_file=env.path(contract.ENV_STATUS_KEY_FILE),
        podinfo_dir=env.path(contract.ENV_PODINFO_DIR),
        inter_node_gbps=env.number(contract.ENV_INTER_NODE_GBPS),
        intra_node_gbps=env.number(contract.ENV_INTRA_NODE_GBPS),
        gpu_memory_budget_bytes=env.integer(contract.ENV_GPU_MEMORY_BUDGET, minimum=1),
        arbiter_socket=env.text(contract.ENV_ARBITER_SOCKET),
        loader=LoaderOverrides(
            num_workers=env.integer(contract.ENV_LOADER_NUM_WORKERS, minimum=0),
            pin_memory=env.flag(contract.ENV_LOADER_PIN_MEMORY),
            persistent_workers=env.flag(contract.ENV_LOADER_PERSISTENT_WORKERS),
            prefetch_factor=env.integer(contract.ENV_LOADER_PREFETCH_FACTOR, minimum=1),
            fetch_threads=env.integer(contract.ENV_LOADER_FETCH_THREADS, minimum=1),
        ),
        total_steps=env.integer(contract.ENV_TOTAL_STEPS, minimum=1),
        telemetry_interval_seconds=_or_default(
            env.number(contract.ENV_TELEMETRY_INTERVAL_SECONDS, zero_ok=True),
            DEFAULT_TELEMETRY_INTERVAL_SECONDS,
        ),
        in_place=_in_place(env),
    )


def _in_place(env: _Reader) -> InPlace:
    backend = env.text(contract.ENV_PET_RDZV_BACKEND)
    restarts = env.integer(contract.ENV_PET_MAX_RESTARTS, minimum=0) or 0
    hang = env.number(contract.ENV_HANG_TIMEOUT_SECONDS)
    if backend != contract.RDZV_BACKEND:
        why = (
            f"{contract.ENV_PET_RDZV_BACKEND} is {backend!r}, not {contract.RDZV_BACKEND!r}"
            if backend
            else f"no {contract.ENV_PET_RDZV_BACKEND} (spec.runtime.inPlaceRestarts is 0, "
            "or an operator without in-place restarts)"
        )
        return InPlace(hang_timeout_seconds=hang, reason=f"off: {why}")
    if restarts == 0:
        return InPlace(
            hang_timeout_seconds=hang, reason=f"off: {contract.ENV_PET_MAX_RESTARTS} is 0"
        )
    return InPlace(
        enabled=True,
        max_restarts=restarts,
        hang_timeout_seconds=hang,
        hosts_store=_rendezvous_conf(env.text(contract.ENV_PET_RDZV_CONF)).get("is_host")
        in ("true", "1"),
        peers=_peers(env),
        replacement=bool(env.flag(contract.ENV_REPLACEMENT)),
    )


def _peers(env: _Reader) -> tuple[str, ...]:
    """Every other worker's address: TRAINWAVE_WORKER_ADDRESS formatted for each rank
    below PET_NNODES (`N`, or torchrun's `MIN:MAX`: the most), but NODE_RANK."""
    template = env.text(contract.ENV_WORKER_ADDRESS)
    if template is None:
        return ()
    nodes = (env.text(contract.ENV_PET_NNODES) or "1").rpartition(":")[2]
    if not nodes.isdigit() or int(nodes) < 1:
        raise SettingsError(
            f"{contract.ENV_PET_NNODES}={nodes!r}: expected N or MIN:MAX, whole numbers >= 1"
        )
    if "{rank}" not in template:
        raise SettingsError(
            f"{contract.ENV_WORKER_ADDRESS}={template!r}: expected an address with {{rank}} "
            "where the worker's rank goes"
        )
    me = env.integer(contract.ENV_NODE_RANK, minimum=0) or 0
    return tuple(template.replace("{rank}", str(r)) for r in range(int(nodes)) if r != me)


def _rendezvous_conf(conf: str | None) -> dict[str, str]:
    """torchrun's --rdzv-conf `key=value,...` (run.py _parse_rendezvous_config), lower-cased."""
    pairs = (item.split("=", 1) for item in (conf or "").split(",") if "=" in item)
    return {key.strip(): value.strip().lower() for key, value in pairs}


def _features(environ: Mapping[str, str]) -> dict[str, str]:
    features: dict[str, str] = {}
    for variable, raw in environ.items():
        if not variable.startswith(contract.ENV_FEATURE_PREFIX):
            continue
        name = variable.removeprefix(contract.ENV_FEATURE_PREFIX).lower()
        if name not in contract.RUNTIME_FEATURES:
            # A misspelt feature would otherwise be ignored while its owner
            # believes it switched something on or off.
            accepted = ", ".join(
                contract.ENV_FEATURE_PREFIX + known.upper() for known in contract.RUNTIME_FEATURES
            )
            raise SettingsError(f"{variable}={raw!r}: unknown feature; accepted: {accepted}")
        modes = contract.COMPRESSION_MODES if name == "compression" else contract.FEATURE_MODES
        value = raw.strip().lower()
        if value == "on" and name == "compression":
            value = "auto"  # "on" for compression means "pick the algorithm for me"
        if value not in modes:
            raise SettingsError(f"{variable}={raw!r}: expected one of {', '.join(modes)}")
        features[name] = value
    return features


def _port(env: _Reader) -> int:
    port = env.integer(contract.ENV_STATUS_PORT, minimum=0)
    if port is None:
        return contract.DEFAULT_STATUS_PORT
    if port > 65535:
        raise SettingsError(
            f"{contract.ENV_STATUS_PORT}={port!r}: expected a TCP port 0-65535 (0: any free port)"
        )
    return port


def _or_default(value: float | None, default: float) -> float:
    return default if value is None else value


def _str_or_none(path: Path | None) -> str | None:
    return None if path is None else str(path)


class _Reader:
    """Typed reads of single variables; empty counts as unset (Kubernetes env may be "")."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self._environ = environ

    def text(self, name: str) -> str | None:
        value = self._environ.get(name, "").strip()
        return value or None

    def path(self, name: str) -> Path | None:
        value = self.text(name)
        return None if value is None else Path(value)

    def integer(self, name: str, *, minimum: int) -> int | None:
        return self._parse(name, int, f"an integer >= {minimum}", lambda v: v >= minimum)

    def number(self, name: str, *, zero_ok: bool = False) -> float | None:
        if zero_ok:
            return self._parse(name, float, "a number >= 0", lambda v: 0 <= v < float("inf"))
        return self._parse(name, float, "a number > 0", lambda v: 0 < v < float("inf"))

    def flag(self, name: str) -> bool | None:
        value = self.text(name)
        if value is None:
            return None
        if value.lower() in _TRUE:
            return True
        if value.lower() in _FALSE:
            return False
        raise SettingsError(f"{name}={value!r}: expected one of {', '.join(_TRUE + _FALSE)}")

    def _parse(
        self, name: str, kind: Callable[[str], _T], wanted: str, ok: Callable[[_T], bool]
    ) -> _T | None:
        raw = self.text(name)
        if raw is None:
            return None
        try:
            value = kind(raw)
        except ValueError:
            raise SettingsError(f"{name}={raw!r}: expected {wanted}") from None
        if not ok(value):
            raise SettingsError(f"{name}={raw!r}: expected {wanted}")
        return value
