"""`python -m trainwave.runtime.launch [--] CMD ARGS...`: the worker's entry point.

In order: parse the TRAINWAVE_* settings (a bad value stops here, naming
it); export the operator's per-node environment from the pod's annotations;
apply the zero-code features (TF32 policy, loader defaults, NCCL log for the
doctor); run the doctor; log ONE JSON line with every feature's state; serve
GET /status; run CMD (under torch.distributed.run when PET_NPROC_PER_NODE > 1,
so `torchrun` semantics hold) and supervise it: signals are forwarded, and
the launcher exits with the child's code (128+N when a signal N killed it).

With in-place restarts (the operator's c10d rendezvous in PET_*, settings.in_place)
CMD always runs under torch.distributed.run, whose elastic agent restarts the
gang's processes inside the pods; the launcher watches the generations, counts
restarts by cause and runs the hang watchdog (launcher/restarts.py).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from trainwave import contract, signatures
from trainwave.runtime import jsonlog, reports
from trainwave.runtime.data.loader_defaults import cuda_present, resolve_loader_defaults
from trainwave.runtime.doctor import DoctorReport, Host, Status, run_doctor
from trainwave.runtime.launcher import (
    announce,
    environment,
    podinfo,
    preflight,
    rejoin,
    supervisor,
    warm,
)
from trainwave.runtime.launcher.restarts import Monitor
from trainwave.runtime.launcher.status import StatusServer
from trainwave.runtime.launcher.supervisor import Supervisor
from trainwave.runtime.settings import Settings, SettingsError, load_settings

USAGE = "usage: python -m trainwave.runtime.launch [--] CMD [ARGS...]"
EXIT_USAGE = 2
EXIT_DOCTOR = 3


WARM_MODULE = "trainwave.runtime.launcher.warm"
_PYTHON = re.compile(r"python(\d+(\.\d+)?)?")


def child_command(
    command: Sequence[str], nproc_per_node: int, in_place: bool = False, warm: bool = False
) -> list[str]:
    """CMD itself, or CMD under torch.distributed.run, which reads the PET_* variables:
    always with in-place restarts (one process per worker too: its agent restarts it),
    and then warm-started (launcher/warm.py) when `warm` and CMD is a Python script."""
    script = warm_arguments(command) if in_place and warm else None
    if script is not None:
        return [sys.executable, "-m", WARM_MODULE, *script]
    if (nproc_per_node <= 1 and not in_place) or Path(command[0]).name in ("torchrun",):
        return list(command)
    run = [sys.executable, "-m", "torch.distributed.run"]
    if command[0].endswith(".py"):
        return [*run, *command]
    # torchrun starts non-script commands (`python -u train.py`, `bash x.sh`) as is.
    return [*run, "--no-python", *command]


def warm_arguments(command: Sequence[str]) -> list[str] | None:
    """torchrun's arguments for CMD when it runs a Python script: `train.py ARGS`,
    `python [-u] train.py ARGS` or `torchrun [OPTIONS] train.py ARGS`; None otherwise
    (another program, or interpreter options a forked process could not honour)."""
    head = Path(command[0]).name
    if head == "torchrun":
        return list(command[1:])  # warm.py parses OPTIONS as torchrun would
    if command[0].endswith(".py"):
        return list(command)
    if _PYTHON.fullmatch(head):
        rest = list(command[1:])
        while rest[:1] == ["-u"]:  # unbuffered output: warm.py's children write unbuffered
            rest = rest[1:]
        if rest and rest[0].endswith(".py"):
            return rest
    return None


def warm_state(settings: Settings, command: Sequence[str]) -> str:
    mode = settings.feature("warm_start")
    if mode == "off":
        return "off"
    if not settings.in_place.enabled:
        return f"{mode}: not used, in-place restarts are off"
    if WARM_MODULE in command[:3]:
        return (
            f"{mode}: each generation forked from a process that imported torch "
            f"({WARM_MODULE}; {contract.ENV_WARM_PRELOAD} adds modules)"
        )
    return f"{mode}: not used, the command is not a Python script; fresh interpreters"


NO_TORCH = (
    "off: torch is not importable by this interpreter, so the command runs as is, without "
    "torch's elastic agent (a failure recreates the gang)"
)


def in_place_where_possible(
    settings: Settings, torch_present: Callable[[], bool] | None = None
) -> Settings:
    """In-place restarts need torch's elastic agent in the worker's own image: a worker that
    runs no torch (a data job, a shell script) keeps running its command directly."""
    present = torch_present or (lambda: importlib.util.find_spec("torch") is not None)
    if not settings.in_place.enabled or present():
        return settings
    off = dataclasses.replace(settings.in_place, enabled=False, reason=NO_TORCH)
    return dataclasses.replace(settings, in_place=off)


def machine_facts() -> environment.Machine:
    cuda = cuda_present()
    return environment.Machine(cuda=cuda, capability=_nvml_capability() if cuda else None)


def _nvml_capability() -> tuple[int, int] | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            return int(major), int(minor)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no bindings or no driver: the TF32 state says so
        return None


class Launcher:
    def __init__(self, settings: Settings, environ: Mapping[str, str]) -> None:
        self.settings = settings
        self.environ = dict(environ)
        self.doctor: DoctorReport | None = None
        self.doctor_state = "off"
        self.started = time.time()
        self.monitor = Monitor(settings.in_place, settings.report_dir, log_line)
        self.preflight: dict[str, Any] | None = None  # runPolicy.preflight's test, once run
        self.supervisor = Supervisor(settings, self.monitor, log_line)

    def run_doctor(self, child_env: Mapping[str, str]) -> None:
        if self.settings.feature("doctor") == "off":
            return
        logs = tuple(sorted(self.settings.report_dir.glob(reports.NCCL_LOG_GLOB)))
        self.doctor = run_doctor(Host(root=Path("/"), environ=child_env, nccl_logs=logs))
        reports.write_json_atomic(
            self.settings.report_dir / reports.DOCTOR_FILE, self.doctor.as_dict()
        )
        failures = [c.name for c in self.doctor.checks if c.status is Status.FAIL]
        self.doctor_state = f"{self.doctor.verdict.value}" + (f": {failures}" if failures else "")

    def status(self) -> dict[str, Any]:
        """The /status document; the NCCL proof is re-read, since it appears after start."""
        doctor = self.doctor
        if doctor is not None:
            logs = tuple(sorted(self.settings.report_dir.glob(reports.NCCL_LOG_GLOB)))
            if logs:
                from trainwave.runtime.doctor.nccl_log import check_nccl_logs

                fresh = check_nccl_logs(Host(environ=self.environ), logs)
                doctor = DoctorReport.of(
                    fresh if c.name == fresh.name else c for c in doctor.checks
                )
        return {
            "namespace": self.settings.identity.namespace,
            "job": self.settings.identity.job_name,
            "rank": self.settings.identity.rank,
            "node_rank": self.settings.identity.node_rank,
            "attempt": self.settings.identity.attempt,
            "uptime_seconds": round(time.time() - self.started, 1),
            "child": supervisor.describe(self.supervisor),
            "doctor": None if doctor is None else doctor.as_dict(),
            "progress": reports.latest_progress(self.settings.report_dir),
            **self.monitor.status(),  # "ranks", "restarts"
            "in_place": self.settings.in_place.as_dict(),
            "preflight": self.preflight,
        }

    def publish(self, preflight: dict[str, Any]) -> None:
        self.preflight = preflight

    def supervise(self, command: Sequence[str], env: Mapping[str, str]) -> int:
        """Run the child until it ends (launcher/supervisor.py)."""
        return self.supervisor.run(command, env)


def log_line(event: str, **fields: Any) -> None:
    jsonlog.emit("trainwave.launch", event, **fields)


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--"]:
        args = args[1:]
    if not args or args[0] in ("-h", "--help"):
        print(USAGE, file=sys.stderr)
        return EXIT_USAGE if not args else 0
    environ = dict(os.environ if environ is None else environ)
    try:
        settings = in_place_where_possible(load_settings(environ))
        podinfo_dir = settings.podinfo_dir or Path(contract.PODINFO_MOUNT_PATH)
        worker_env = podinfo.worker_env(podinfo.read_annotations(podinfo_dir))
    except (SettingsError, podinfo.PodInfoError) as error:
        log_line("invalid-settings", error=str(error))
        return EXIT_USAGE
    launcher = Launcher(settings, environ)
    defaults = resolve_loader_defaults(settings)
    prepared = environment.prepare(settings, machine_facts(), defaults, environ, worker_env)
    child_env = {**environ, **prepared.env}
    child_env.update(agent_env(settings, child_env))
    launcher.environ = child_env
    launcher.run_doctor(child_env)
    command = child_command(
        args,
        settings.identity.nproc_per_node,
        in_place=settings.in_place.enabled,
        warm=settings.feature("warm_start") != "off",
    )
    if WARM_MODULE in command[:3]:  # forked processes keep the server's stdout: unbuffered, as -u
        child_env.setdefault("PYTHONUNBUFFERED", "1")
        try:  # refused here, before anything starts, rather than by the agent's crash
            warm.preload_modules(child_env)
        except ValueError as error:
            log_line("invalid-settings", error=str(error))
            return EXIT_USAGE
    key = job_key(settings)
    launcher.supervisor.announcements = store_announcements(settings, key, child_env)
    server = _start_status(settings, launcher, key)
    if server is not None:
        announce_store(settings, key, child_env)
    log_line(
        "settings",
        settings=settings.as_dict(),
        features={
            **prepared.states,
            "doctor": launcher.doctor_state,
            "warm_start": warm_state(settings, command),
        },
        worker_env=sorted(worker_env),
        status_port=None if server is None else server.port,
        command=command,
    )
    try:
        # "on" means the job wants a verified fabric; "auto" only reports.
        doctor = launcher.doctor
        if settings.feature("doctor") == "on" and doctor and doctor.verdict is Status.FAIL:
            log_line("doctor-failed", report=doctor.as_dict())
            return EXIT_DOCTOR
        config = preflight.config_from(child_env)
        if config is not None:  # runPolicy.preflight: the gang's links, before training
            found = preflight.run_preflight(
                config, child_env, settings.report_dir, settings.identity.attempt, launcher.publish
            )
            log_line("preflight", **found)
        code = launcher.supervise(command, child_env)
        log_line("exited", exit_code=code)
        return code
    finally:
        if server is not None:
            server.stop()


def _start_status(settings: Settings, launcher: Launcher, key: bytes | None) -> StatusServer | None:
    announcements = launcher.supervisor.announcements
    posts = {} if announcements is None else {contract.STORE_PATH: announcements.receive}
    try:
        return StatusServer(
            settings.status_host,
            settings.status_port,
            launcher.status,
            _signer(settings, key),
            posts=posts,
        ).start()
    except OSError as error:  # a taken port must not stop training; the log says why
        log_line("status-unavailable", error=str(error), port=settings.status_port)
        return None


def status_signer(settings: Settings) -> Callable[[str, bytes], str] | None:
    """Sign /status answers with the job's mounted key; None (and a log line saying the
    operator will ignore this worker's reports) when there is none or it is unreadable."""
    return _signer(settings, job_key(settings))


def job_key(settings: Settings) -> bytes | None:
    path = settings.status_key_file
    if path is None:
        log_line("status-unsigned", reason=f"{contract.ENV_STATUS_KEY_FILE} is not set")
        return None
    try:
        return signatures.key_from_text(path.read_text())
    except (OSError, ValueError) as error:
        log_line("status-unsigned", reason=f"{path}: {error}")
        return None


def _signer(settings: Settings, key: bytes | None) -> Callable[[str, bytes], str] | None:
    if key is None:
        return None
    identity = worker_identity(settings)
    return lambda nonce, body: signatures.sign(key, identity, nonce, body)


def worker_identity(settings: Settings) -> signatures.Identity:
    who = settings.identity
    return signatures.Identity(
        namespace=who.namespace or "",
        job=who.job_name or "",
        attempt=who.attempt or 0,
        rank=who.node_rank,
    )


def agent_env(settings: Settings, env: Mapping[str, str]) -> dict[str, str]:
    """What the launcher changes for torch's elastic agent (in-place restarts only)."""
    if not settings.in_place.enabled:
        return {}
    # where torch's @record says why the agent ended
    changed = {
        rejoin.ERROR_ENV: env.get(rejoin.ERROR_ENV) or str(settings.report_dir / rejoin.ERROR_FILE)
    }
    if settings.in_place.hosts_store:  # never via DNS: rejoin.py, announce.py
        endpoint = env.get(contract.ENV_PET_RDZV_ENDPOINT, "")
        changed[contract.ENV_PET_RDZV_ENDPOINT] = rejoin.local_endpoint(endpoint)
        address = store_host_address(settings, env)
        if address is not None:
            changed[contract.ENV_PET_LOCAL_ADDR] = address
    return changed


def store_host_address(settings: Settings, env: Mapping[str, str]) -> str | None:
    """The store host's agent names itself by its pod's IP, not its DNS name, when that
    keeps it first in torch's rank order (the sorted addresses: builders/runtime.py
    in_place_env). MASTER_ADDR is group rank 0's name for itself, so every training
    process then reaches the gang's store without DNS, whose caches may hold a replaced
    worker 0's old address for their TTL (launcher/announce.py). None: keep the name."""
    pod_ip = env.get(contract.ENV_POD_IP, "").strip()
    if not pod_ip or not settings.in_place.peers:
        return None
    if pod_ip >= min(settings.in_place.peers):
        log_line("store-host-address", address=None, reason=f"{pod_ip} would not sort first")
        return None
    return pod_ip


def store_announcements(
    settings: Settings, key: bytes | None, env: Mapping[str, str]
) -> announce.Announcements | None:
    """What a worker that may rejoin hears from the store's host (launcher/announce.py)."""
    in_place = settings.in_place
    if not in_place.enabled or in_place.hosts_store:
        return None
    rendezvous = env.get(contract.ENV_PET_RDZV_ID, "")
    return announce.Announcements(key, worker_identity(settings), rendezvous)


def announce_store(settings: Settings, key: bytes | None, env: Mapping[str, str]) -> None:
    """A replacement store host tells the other workers its address, in the background
    while its agent starts. Only a replacement: at a gang's start no agent waits to rejoin,
    and a large gang's first worker would look up every other name while they start."""
    in_place = settings.in_place
    if not (in_place.enabled and in_place.hosts_store and in_place.replacement):
        return
    address = env.get(contract.ENV_POD_IP, "").strip()
    if not (in_place.peers and key and address):
        log_line(
            "store-not-announced",
            peers=len(in_place.peers),
            key=key is not None,
            pod_ip=address or None,
        )
        return
    rendezvous = env.get(contract.ENV_PET_RDZV_ID, "")

    def send() -> None:
        sent = announce.announce(
            in_place.peers,
            settings.status_port,
            rendezvous,
            key,
            worker_identity(settings),
            address=address,
        )
        failed = {peer: why for peer, why in sent.items() if why != "ok"}
        log_line(
            "store-announced",
            peers=len(sent),
            reached=len(sent) - len(failed),
            failed=dict(sorted(failed.items())[:5]),
        )

    threading.Thread(target=send, name="trainwave-announce", daemon=True).start()


if __name__ == "__main__":
    sys.exit(main())
