"""`trainwave operator`: its flags, and the wiring from them to the handlers' options, the
leader elector and kopf.run (what the operator image runs)."""

import argparse
import logging
import os
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from trainwave import contract
from trainwave.cli.arguments import LOG_LEVELS, SubCommands, positive_seconds
from trainwave.placement.queueing import DEFAULT_MAX_SKIPS

if TYPE_CHECKING:
    from trainwave.kube.leadership import LeaderElector


def add_operator_parser(commands: SubCommands) -> None:
    operator = commands.add_parser("operator", help="run the TrainingJob operator")
    operator.add_argument(
        "--namespace",
        action="append",
        default=[],
        metavar="NS",
        help="watch only this namespace (repeatable); default: the whole cluster",
    )
    operator.add_argument("--metrics-port", type=int, default=contract.DEFAULT_METRICS_PORT)
    operator.add_argument("--health-port", type=int, default=contract.DEFAULT_HEALTH_PORT)
    operator.add_argument("--health-host", default="0.0.0.0")
    operator.add_argument("--log-level", choices=LOG_LEVELS, default="info")
    operator.add_argument(
        "--workers", type=int, default=8, help="jobs reconciled concurrently (default 8)"
    )
    operator.add_argument(
        "--topology-levels",
        default="",
        help="comma-separated node labels, highest level first (default: spine, rack, host)",
    )
    operator.add_argument(
        "--runtime-image",
        default=contract.DEFAULT_RUNTIME_IMAGE,
        help="image of the runtime init container for jobs with spec.runtime",
    )
    operator.add_argument(
        "--arbiter-dir",
        default="",
        metavar="PATH",
        help="host directory of the node-local GPU-memory arbiter's sockets (the agent "
        "DaemonSet's arbiter container); shared workers with the runtime mount it. "
        "Default: none (no arbiter)",
    )
    operator.add_argument(
        "--gpu-claims",
        action="store_true",
        help="give each shared-GPU worker a DRA ResourceClaim for the GPU it is placed on, "
        "so kube-scheduler accounts every GPU's memory (needs the agent's --gpu-slices and "
        "the DRAConsumableCapacity feature gate)",
    )
    add_status_flags(operator)
    operator.add_argument(
        "--queue-max-skips",
        type=_max_skips,
        default=DEFAULT_MAX_SKIPS,
        metavar="N",
        help="how many gangs may start on room a blocked, larger gang could use before that "
        "gang is protected and every node it could use is held for it (bounded backfill; 0 "
        f"is strict first-come first-served; default {DEFAULT_MAX_SKIPS})",
    )
    operator.add_argument(
        "--kueue",
        action="store_true",
        help="admit jobs labelled kueue.x-k8s.io/queue-name through Kueue Workloads "
        "(needs Kueue's CRDs; without this flag the label is ignored)",
    )
    add_leader_election_flags(operator)


def add_status_flags(operator: argparse.ArgumentParser) -> None:
    """How the operator reads the workers' runtime status (controller/reporting.py)."""
    operator.add_argument(
        "--status-networks",
        default="",
        metavar="CIDRS",
        help="comma-separated CIDRs of pod IPs whose runtime status the operator may read "
        "(default: any)",
    )
    operator.add_argument(
        "--status-interval-seconds",
        type=_status_interval,
        default=15.0,
        metavar="SECONDS",
        help="seconds between two reads of each running worker's runtime status (one HTTP "
        "GET per worker per interval; at least 1, default 15). Hangs and stragglers are "
        "seen up to one interval late",
    )
    operator.add_argument(
        "--status-key-secret",
        default="",
        metavar="NAMESPACE/NAME",
        help="the Secret holding the master key each job's status key is derived from; "
        "created on first start (default: $POD_NAMESPACE or trainwave-system, "
        f"/{contract.DEFAULT_STATUS_KEY_SECRET})",
    )


def add_leader_election_flags(operator: argparse.ArgumentParser) -> None:
    """kube-scheduler's flag names and controller-runtime's defaults (15/10/2 s)."""
    operator.add_argument(
        "--leader-elect",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="hold a coordination.k8s.io Lease before acting, so replicas can stand by "
        "(default on; --no-leader-elect runs alone and must be the only replica)",
    )
    operator.add_argument(
        "--leader-elect-resource-name",
        default="trainwave-leader",
        metavar="NAME",
        help="the Lease's name (default trainwave-leader)",
    )
    operator.add_argument(
        "--leader-elect-resource-namespace",
        default="",
        metavar="NS",
        help="the Lease's namespace (default: $POD_NAMESPACE, then the in-cluster "
        "ServiceAccount's namespace)",
    )
    for flag, default, what in (
        ("lease-duration", 15.0, "how long a standby waits on an unrenewed lease"),
        ("renew-deadline", 10.0, "how long the leader keeps trying to renew before it exits"),
        ("retry-period", 2.0, "seconds between attempts to acquire or renew"),
    ):
        operator.add_argument(
            f"--leader-elect-{flag}",
            type=positive_seconds,
            default=default,
            metavar="SECONDS",
            help=f"{what} (default {default:g})",
        )


def _max_skips(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a whole number, 0 or more")
    return value


def _status_interval(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value >= 1:  # also refuses NaN
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number of seconds, at least 1")
    return value


def run_operator(options: argparse.Namespace) -> int:
    from trainwave.controller.allocator import limit_arenas

    limit_arenas()  # before any thread starts: allocator.py says why
    import kopf

    from trainwave.controller import handlers

    if os.environ.get("TRAINWAVE_TRACEMALLOC"):  # a diagnostic, off by default: heap_report.py
        from trainwave.controller.heap_report import install_from_env

        install_from_env()  # after the imports: tracing them takes minutes

    logging.basicConfig(
        level=options.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # kopf logs every handler call at INFO; ours are the ones worth reading.
    quiet = max(logging.WARNING, logging.getLogger().level)
    logging.getLogger("kopf").setLevel(quiet)
    logging.getLogger("aiohttp.access").setLevel(quiet)  # a line per health probe
    handlers.OPTIONS.metrics_port = options.metrics_port
    handlers.OPTIONS.workers = options.workers
    handlers.OPTIONS.runtime_image = options.runtime_image
    if options.arbiter_dir and not options.arbiter_dir.startswith("/"):
        print(f"trainwave operator: --arbiter-dir {options.arbiter_dir!r}: expected an "
              "absolute path", file=sys.stderr)  # fmt: skip
        return 2
    handlers.OPTIONS.arbiter_dir = options.arbiter_dir or None
    handlers.OPTIONS.gpu_claims = options.gpu_claims
    from trainwave.controller.reporting import parse_networks

    try:
        handlers.OPTIONS.status_networks = parse_networks(options.status_networks)
    except ValueError as error:
        print(f"trainwave operator: {error}", file=sys.stderr)
        return 2
    handlers.OPTIONS.status_interval_seconds = options.status_interval_seconds
    handlers.OPTIONS.queue_max_skips = options.queue_max_skips
    handlers.OPTIONS.namespaces = tuple(options.namespace or ())
    handlers.OPTIONS.kueue = options.kueue
    secret = options.status_key_secret or (
        f"{os.environ.get('POD_NAMESPACE') or 'trainwave-system'}/"
        f"{contract.DEFAULT_STATUS_KEY_SECRET}"
    )
    namespace, _, name = secret.partition("/")
    if not namespace or not name:
        print(f"trainwave operator: --status-key-secret {secret!r}: expected NAMESPACE/NAME",
              file=sys.stderr)  # fmt: skip
        return 2
    handlers.OPTIONS.status_key_secret = (namespace, name)
    levels = tuple(x for x in options.topology_levels.split(",") if x)
    if levels:
        handlers.OPTIONS.topology_levels = levels
    if options.leader_elect:
        try:
            handlers.OPTIONS.leadership = elector(options)
        except ValueError as error:
            print(f"trainwave operator: {error}", file=sys.stderr)
            return 2
        handlers.OPTIONS.leadership.start()
    # kopf names itself <user>@<host> through getpass.getuser(), which raises for a uid
    # without a passwd entry: the chart's 65532 in an image that has none (any
    # runAsUser can be that). It takes POD_ID first; the pod's name is what it is for.
    os.environ.setdefault("POD_ID", os.environ.get("POD_NAME") or socket.gethostname())
    # standalone: kopf's peering is not leader election (see kube/leadership.py).
    kopf.run(
        standalone=True,
        clusterwide=not options.namespace,
        namespaces=options.namespace,
        liveness_endpoint=f"http://{options.health_host}:{options.health_port}/healthz",
    )
    # kopf.run returns after its cleanup and after the loop's executor has finished every
    # API call in flight; only now is it safe to hand the Lease over.
    if handlers.OPTIONS.leadership is not None:
        handlers.OPTIONS.leadership.release()
    return 0


def elector(options: argparse.Namespace) -> "LeaderElector":
    import socket

    from trainwave.controller.kube import load_config
    from trainwave.kube.leadership import LeaderElector, Timing, identity
    from trainwave.kube.leases import LeaseClient

    timing = Timing(
        options.leader_elect_lease_duration,
        options.leader_elect_renew_deadline,
        options.leader_elect_retry_period,
    )
    namespace = options.leader_elect_resource_namespace or _own_namespace()
    if not namespace:
        raise ValueError(
            "no namespace for the leader Lease: pass --leader-elect-resource-namespace "
            "or set $POD_NAMESPACE (the chart sets it from the downward API)"
        )
    pod = os.environ.get("POD_NAME", "")
    # Its own connection pool: reconcile traffic must never queue the renewal.
    leases = LeaseClient(load_config(pool_size=2), namespace, options.leader_elect_resource_name)
    return LeaderElector(leases, identity(pod or socket.gethostname()), timing, pod_name=pod)


def _own_namespace() -> str:
    path = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
    try:
        return os.environ.get("POD_NAMESPACE") or path.read_text().strip()
    except OSError:
        return ""
