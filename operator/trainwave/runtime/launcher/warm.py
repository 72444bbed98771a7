"""`python -m trainwave.runtime.launcher.warm [torchrun options] script.py [args]`.

torchrun, with every generation of training processes forked from a process that has
already imported torch. Under plain torchrun each in-place restart starts fresh
interpreters that import torch (and torch._dynamo, which building an optimizer pulls
in) again: most of a restart's time on a busy node (docs/benchmarks/faults.md, "Where an
in-place restart's time goes").

Only upstream parts: torchrun's own argument parser and elastic agent
(torch/distributed/run.py), its `--run-path` entry point (the script runs in the
worker process through runpy, as `run_script_path` there does) and the forkserver
start method, whose server imports the preload modules once
(multiprocessing/forkserver.py, set_forkserver_preload). The server starts before the
agent imports torch, so its imports overlap the agent's own and the wait for the gang.

A command this cannot run the same way (`--no-python`, `-m module`, a start method the
user chose, a script that is not a file) runs under plain torchrun, and says why.
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from trainwave import contract
from trainwave.runtime import jsonlog, reports

# torch first; torch.distributed.run is what the workers' _wrap unpickles; torch._dynamo
# is what torch's optimizers import on first use (torch 2.x wraps them in it).
BASE_PRELOAD = ("torch", "torch.distributed.run", "torch._dynamo")
START_METHOD_FLAGS = ("--start-method", "--start_method")


def preload_modules(environ: Mapping[str, str]) -> list[str]:
    """The modules the server imports: torch's, then the job's own (TRAINWAVE_WARM_PRELOAD)."""
    extra = [name.strip() for name in environ.get(contract.ENV_WARM_PRELOAD, "").split(",")]
    modules = [*BASE_PRELOAD, *(name for name in extra if name)]
    bad = [name for name in modules if not all(part.isidentifier() for part in name.split("."))]
    if bad:
        raise ValueError(
            f"{contract.ENV_WARM_PRELOAD}={environ.get(contract.ENV_WARM_PRELOAD)!r}: "
            f"{bad[0]!r} is not a module name; expected comma-separated dotted names"
        )
    return list(dict.fromkeys(modules))


def cold_reason(args: object, argv: Sequence[str], environ: Mapping[str, str]) -> str | None:
    """Why this command must run under plain torchrun; None when it can run warm."""
    if getattr(args, "no_python", False):
        return "--no-python: the command is not a Python script"
    if getattr(args, "module", False):
        return "-m: a module, not a script file"
    chosen = any(a.split("=")[0] in START_METHOD_FLAGS for a in argv) or "PET_START_METHOD" in (
        environ
    )
    if chosen and getattr(args, "start_method", None) != "forkserver":
        return f"the command chose the start method {getattr(args, 'start_method', None)!r}"
    script = Path(str(getattr(args, "training_script", "")))
    if not script.is_file():
        return f"{script} is not a file here"
    return None


def _first_generation_started(environ: Mapping[str, str]) -> Callable[[], bool]:
    """True once a training process wrote its identity (warm_child.py), or at once
    without a report directory."""
    report_dir = environ.get(contract.ENV_REPORT_DIR)
    if not report_dir:
        return lambda: True
    identities = Path(report_dir) / reports.IDENTITY_DIR
    return lambda: identities.is_dir() and any(identities.iterdir())


def _import_quietly(module: str, ready: Callable[[], bool], poll: float = 0.5) -> None:
    while not ready():
        time.sleep(poll)
    try:
        importlib.import_module(module)
    except Exception as error:  # an optional speed-up: the failure path imports it anyway
        log_line("preload-failed", module=module, error=repr(error))


def log_line(event: str, **fields: object) -> None:
    jsonlog.emit("trainwave.warm", event, **fields)


def _start_forkserver(modules: Sequence[str]) -> str | None:
    """Start the forkserver, which imports `modules`; why it did not start, else None."""
    import multiprocessing
    from multiprocessing import forkserver

    multiprocessing.set_forkserver_preload(list(modules))
    try:
        forkserver.ensure_running()
    except OSError as error:  # e.g. no writable temp directory for its socket (TMPDIR)
        return f"the forkserver did not start: {error}"
    return None


def _stop_forkserver() -> None:
    from multiprocessing import forkserver

    # No public way to stop it; a server left running would hold torch's memory all along.
    stop = getattr(forkserver._forkserver, "_stop", None)
    if stop is not None:
        stop()


def main(argv: Sequence[str] | None = None) -> None:
    # The server starts before this process imports torch, so that the two imports run side
    # by side: started after it, the server was still importing when a replaced worker's
    # gang had met (2.2-5.3 s from the round to the first step on the real node,
    # docs/benchmarks/faults.md). Its imports then overlap the agent's and the rendezvous. A
    # command that must run cold stops it again.
    modules = preload_modules(os.environ)
    failed = _start_forkserver(modules)

    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.errors import record

    argv = list(sys.argv[1:] if argv is None else argv)
    args = torchrun.parse_args(argv)  # type: ignore[no-untyped-call]
    why = cold_reason(args, argv, os.environ) or failed
    if why is not None:
        if failed is None:
            _stop_forkserver()
        log_line("cold-start", reason=why)
        torchrun.main(argv)
        return
    args.run_path, args.start_method = True, "forkserver"
    args.training_script = os.path.abspath(args.training_script)  # as `python x.py` makes it
    if args.master_port is None:  # as torchrun's run() does; only the static backend reads it
        args.master_port = 29500
    # The agent logs a failed worker with logger.exception, and torch's log formatter
    # imports torch._dynamo to format it (torch/_logging/_internal.py, format): seconds of
    # imports between a failure and the restart, measured 7-9 s on 2 busy cores. Imported
    # ahead, once the first generation runs: not during the rendezvous, where it took the
    # agent's CPU (and GIL) while a whole gang waited for it.
    started = _first_generation_started(os.environ)
    threading.Thread(target=_import_quietly, args=("torch._dynamo", started), daemon=True).start()
    log_line("warm-start", preload=modules, script=args.training_script)
    config, _, script_args = torchrun.config_from_args(args)
    record(_agent_until_done)(config, script_args)


def _agent_until_done(config: Any, script_args: Sequence[str]) -> None:
    """torch's elastic agent; when it loses the rendezvous store, and the launcher says
    where the new one is (rejoin.py), again in this process, whose forkserver has imported
    torch already. warm_child.run in place of torchrun's run_script_path: the same runpy
    call, after it leaves the rank and generation where the launcher's monitor looks."""
    from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError
    from torch.distributed.launcher.api import elastic_launch

    from trainwave.runtime.launcher import rejoin, warm_child

    report_dir = os.environ.get(contract.ENV_REPORT_DIR)
    launcher = os.getppid()
    while True:
        try:
            elastic_launch(config=config, entrypoint=warm_child.run)(*script_args)
            return
        except RendezvousConnectionError as error:
            if not report_dir:
                raise
            message = f"{type(error).__name__}: {error}"
            endpoint = rejoin.ask(Path(report_dir), message, alive=lambda: os.getppid() == launcher)
            if endpoint is None:
                raise
            log_line("rejoined", endpoint=endpoint, forkserver="kept")
            config.rdzv_endpoint = endpoint


if __name__ == "__main__":
    main()
