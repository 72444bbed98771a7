"""`trainwave`: the command the operator image runs, and tools for people.

trainwave operator [--namespace NS]... [--metrics-port N] [--health-port N] [--leader-elect ...]
trainwave agent [--node-name N] [--root DIR] [--interval S] [--once] [--shared-gpus ...]
trainwave doctor [--root /] [--json] [--nccl-log FILE]...   GPUDirect RDMA checklist
trainwave crd            print the TrainingJob CRD the models define
trainwave size           per-GPU memory and FLOPs of a training step; whole or shared GPUs
trainwave logs JOB [-n NS] [--attempt N] [--rank R] [-f]   the gang's worker logs, by rank
trainwave version
"""

import argparse
import logging
import os
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from trainwave import __version__, contract

if TYPE_CHECKING:
    from trainwave.kube.leadership import LeaderElector

LOG_LEVELS = ("debug", "info", "warning", "error")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="trainwave", description="trainwave operator and tools")
    commands = parser.add_subparsers(dest="command", required=True)

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
        "--workers", type=int, default=4, help="jobs reconciled concurrently (default 4)"
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
        "--kueue",
        action="store_true",
        help="admit jobs labelled kueue.x-k8s.io/queue-name through Kueue Workloads "
        "(needs Kueue's CRDs; without this flag the label is ignored)",
    )
    add_leader_election_flags(operator)
    planner = commands.add_parser("plan", help="dry-run placement of a TrainingJob manifest")
    planner.add_argument("manifest", help="a TrainingJob YAML file")
    planner.add_argument(
        "--topology-levels",
        default="",
        help="comma-separated node labels, highest level first (default: spine, rack, host)",
    )
    agent = commands.add_parser(
        "agent", help="run the node agent: publish this node's GPUs, NICs and shared GPU memory"
    )
    agent.add_argument(
        "--node-name",
        default=os.environ.get(contract.ENV_NODE_NAME, ""),
        help=f"the Node to publish to (default: ${contract.ENV_NODE_NAME}, from the downward API)",
    )
    agent.add_argument(
        "--root",
        type=Path,
        default=Path("/"),
        help="where the host's /sys and /proc are mounted (default /)",
    )
    agent.add_argument(
        "--interval", type=_positive_seconds, default=60.0, help="seconds between passes"
    )
    agent.add_argument("--once", action="store_true", help="one pass; exit 1 if it failed")
    agent.add_argument(
        "--fake-gpus",
        type=Path,
        metavar="FILE",
        help="read GPUs from this JSON file instead of NVML (tests, simulated nodes)",
    )
    agent.add_argument(
        "--shared-gpus",
        type=_shared_gpus,
        default="none",
        help="GPUs offered for sharing: none, all, or indexes such as 0,1 (default none)",
    )
    agent.add_argument(
        "--arbiter-dir",
        type=Path,
        metavar="DIR",
        help=f"write the shared GPUs and their bytes to DIR/{contract.ARBITER_GPUS_FILE} for "
        "the node-local arbiter (default: no arbiter)",
    )
    agent.add_argument(
        "--gpu-slices",
        action="store_true",
        help=f"publish each shared GPU as a DRA ResourceSlice of driver {contract.DRA_DRIVER} "
        "(needs the DRAConsumableCapacity feature gate; see the README's Shared GPUs)",
    )
    _add_kubelet_plugin_arguments(agent)
    agent.add_argument("--log-level", choices=LOG_LEVELS, default="info")
    doctor = commands.add_parser("doctor", help="check this worker's GPUDirect RDMA setup")
    doctor.add_argument("--root", default="/", help="read /sys, /proc and /dev under this root")
    doctor.add_argument("--json", action="store_true", help="print the report as JSON")
    doctor.add_argument(
        "--nccl-log",
        action="append",
        default=[],
        metavar="FILE",
        help="NCCL_DEBUG=INFO output to judge the transport from (repeatable)",
    )
    add_size_parser(commands)
    add_logs_parser(commands)
    commands.add_parser("crd", help="print the TrainingJob CustomResourceDefinition")
    commands.add_parser("version", help="print the version")

    options = parser.parse_args(argv)
    if options.command == "version":
        print(__version__)
        return 0
    if options.command == "crd":
        from trainwave.api.generate import render_crd

        sys.stdout.write(render_crd())
        return 0
    if options.command == "plan":
        return run_plan(options)
    if options.command == "agent":
        return run_agent(options)
    if options.command == "doctor":
        return run_doctor(options)
    if options.command == "size":
        return run_size(options)
    if options.command == "logs":
        return run_logs(options)
    return run_operator(options)


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
            type=_positive_seconds,
            default=default,
            metavar="SECONDS",
            help=f"{what} (default {default:g})",
        )


def run_plan(options: argparse.Namespace) -> int:
    import yaml

    from trainwave.api.trainingjob import InvalidSpec
    from trainwave.controller.kube import KubeClient, load_config
    from trainwave.controller.planning import plan, render
    from trainwave.placement.queueing import Wait
    from trainwave.placement.topology import DEFAULT_LEVELS

    with open(options.manifest) as stream:
        manifest = yaml.safe_load(stream)
    levels = [x for x in options.topology_levels.split(",") if x] or list(DEFAULT_LEVELS)
    try:
        result = plan(manifest, KubeClient(load_config(pool_size=2)), levels)
    except InvalidSpec as invalid:
        print(f"{options.manifest}: invalid: {invalid}", file=sys.stderr)
        return 2
    print(render(result))
    return 1 if isinstance(result, Wait) else 0


def add_logs_parser(commands: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    logs = commands.add_parser(
        "logs",
        help="print a TrainingJob's worker logs, each line prefixed with its rank",
        description="Logs of every worker of the current attempt (rank order; merged as they "
        "arrive with --follow). After a restart, the previous attempt's first failed worker "
        "comes first, prefixed [aN rank R].",
    )
    logs.add_argument("job", help="the TrainingJob's name")
    logs.add_argument("-n", "--namespace", default="", help="default: the kubeconfig's namespace")
    logs.add_argument("--attempt", type=int, help="this attempt instead of the current one")
    logs.add_argument("--rank", type=int, help="only this rank's worker")
    logs.add_argument("-f", "--follow", action="store_true", help="stream until the workers end")


def run_logs(options: argparse.Namespace) -> int:
    from trainwave.controller.kube import load_config
    from trainwave.controller.streaming import (
        LogRequest,
        NoLogs,
        current_namespace,
        gather_sources,
        print_logs,
    )

    api = load_config(pool_size=32)  # a connection per followed worker, up to 32 kept
    namespace = options.namespace or current_namespace()
    request = LogRequest(namespace, options.job, options.attempt, options.rank, options.follow)
    try:
        sources = gather_sources(api, request)
    except NoLogs as missing:
        print(f"trainwave logs: {missing}", file=sys.stderr)
        return 2
    return print_logs(api, request, sources, sys.stdout, sys.stderr)


def run_agent(options: argparse.Namespace) -> int:
    import signal
    import threading

    from trainwave.agent.publishing import NodePublisher, PublishError, connect
    from trainwave.agent.running import Agent, AgentOptions

    logging.basicConfig(
        level=options.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # urllib3 logs each retry of a refused connection; the pass's own error says it once.
    logging.getLogger("urllib3.connectionpool").setLevel(
        max(logging.ERROR, logging.getLogger().level)
    )
    if not options.node_name:
        print(
            f"trainwave agent: no node name: pass --node-name or set ${contract.ENV_NODE_NAME} "
            "(the chart sets it from the downward API, spec.nodeName)",
            file=sys.stderr,
        )
        return 2
    try:
        publisher = NodePublisher(connect(), options.node_name)
    except PublishError as error:
        print(f"trainwave agent: {error}", file=sys.stderr)
        return 1
    agent = Agent(
        AgentOptions(
            options.node_name,
            options.root,
            options.shared_gpus,
            options.fake_gpus,
            arbiter_dir=options.arbiter_dir,
            gpu_slices=options.gpu_slices,
            cdi_dir=options.cdi_dir if options.kubelet_plugin else None,
        ),
        publisher.publish,
        publish_errors=(PublishError,),
    )
    if options.once:
        return 0 if agent.run_once() else 1
    plugin = None
    stop, wake = threading.Event(), threading.Event()
    if options.kubelet_plugin:
        from trainwave.agent.kubelet.plugin import KubeletPlugin

        # A (re)started kubelet deletes the node's ResourceSlices: publish again at once.
        plugin = KubeletPlugin(
            options.node_name, publisher.read_claim, options.kubelet_dir, on_registered=wake.set
        )
        plugin.start()

    if options.gpu_slices:
        from trainwave.agent.slice_watch import SliceWatch

        SliceWatch(publisher.resources, options.node_name, wake.set).start(stop)

    def terminate(*_: object) -> None:  # finish the pass, then exit
        stop.set()
        wake.set()

    signal.signal(signal.SIGTERM, terminate)
    try:
        agent.run_forever(options.interval, stop, wake)
    finally:
        if plugin is not None:
            plugin.stop()
    return 0


def _add_kubelet_plugin_arguments(agent: argparse.ArgumentParser) -> None:
    agent.add_argument(
        "--kubelet-plugin",
        action="store_true",
        help=f"serve the kubelet side of DRA driver {contract.DRA_DRIVER} (registration and "
        "NodePrepareResources sockets under --kubelet-dir) and write the shared GPUs' CDI "
        "spec to --cdi-dir",
    )
    agent.add_argument("--kubelet-dir", type=Path, default=Path("/var/lib/kubelet"))
    agent.add_argument("--cdi-dir", type=Path, default=Path("/var/run/cdi"))


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number of seconds above 0")
    return value


def _status_interval(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value >= 1:  # also refuses NaN
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number of seconds, at least 1")
    return value


def _shared_gpus(text: str) -> object:
    from trainwave.agent.sharing import SharingError, parse_selection

    try:
        return parse_selection(text)
    except SharingError as error:
        raise argparse.ArgumentTypeError(str(error)) from error


def run_doctor(options: argparse.Namespace) -> int:
    """Exit 0 on PASS, 1 on WARN, 2 on FAIL, so scripts can gate on it."""
    import json
    import os
    from pathlib import Path

    from trainwave.runtime.doctor import Host, Status, run_doctor

    host = Host(
        root=Path(options.root),
        environ=dict(os.environ),
        nccl_logs=tuple(Path(log) for log in options.nccl_log),
    )
    report = run_doctor(host)
    print(json.dumps(report.as_dict(), indent=2) if options.json else report.render())
    return {Status.PASS: 0, Status.WARN: 1, Status.FAIL: 2}[report.verdict]


def add_size_parser(commands: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    from trainwave.sizing.setup import CHECKPOINTING, OPTIMIZER_STATES, PRECISIONS
    from trainwave.sizing.shapes import PRESETS

    size = commands.add_parser("size", help="GPU memory and FLOPs of a training step")
    what = size.add_mutually_exclusive_group(required=True)
    what.add_argument("--model", choices=sorted(PRESETS), help="a named architecture")
    what.add_argument("--params", type=int, help="only a parameter count (no activations)")
    what.add_argument("--mlp", metavar="W,W,...", help="MLP widths, input to output")
    what.add_argument("--layers", type=int, help="a transformer: also --hidden --heads --vocab")
    for flag in ("--hidden", "--heads", "--vocab", "--ffn"):
        size.add_argument(flag, type=int, default=0)
    size.add_argument("--precision", choices=list(PRECISIONS), default="bf16-mixed")
    size.add_argument("--optimizer", choices=list(OPTIMIZER_STATES), default="adamw")
    size.add_argument("--micro-batch", type=int, default=1)
    size.add_argument("--seq", type=int, default=0, help="tokens per sample")
    size.add_argument("--checkpointing", choices=list(CHECKPOINTING), default="off")
    size.add_argument("--dp", type=int, default=1, help="data-parallel degree")
    size.add_argument("--tp", type=int, default=1, help="tensor-parallel degree")
    size.add_argument("--sequence-parallel", action="store_true")
    size.add_argument("--zero", type=int, default=0, help="ZeRO stage 0-3")
    size.add_argument("--gpu-memory-gib", type=float, default=80.0)
    size.add_argument(
        "--gpu-tflops",
        type=float,
        default=312.0,
        help="the GPU's peak dense 16-bit TFLOP/s (A100: 312, H100 SXM: 989)",
    )
    size.add_argument("--json", action="store_true", help="print JSON")


def run_size(options: argparse.Namespace) -> int:
    import json

    from trainwave.sizing.errors import SizingError
    from trainwave.sizing.flops import step_flops
    from trainwave.sizing.recommend import recommend
    from trainwave.sizing.report import render_json, render_text
    from trainwave.sizing.setup import TrainingSetup
    from trainwave.sizing.shapes import MLPShape, Model, ParameterCount, TransformerShape, preset

    try:
        model: Model
        if options.model:
            model = preset(options.model)
        elif options.params is not None:
            model = ParameterCount(options.params)
        elif options.mlp:
            model = MLPShape(tuple(int(w) for w in options.mlp.split(",")))
        else:
            model = TransformerShape(
                layers=options.layers,
                hidden=options.hidden,
                heads=options.heads,
                vocab=options.vocab,
                ffn=options.ffn,
            )
        setup = TrainingSetup(
            precision=options.precision,
            optimizer=options.optimizer,
            micro_batch=options.micro_batch,
            sequence=options.seq,
            checkpointing=options.checkpointing,
            data_parallel=options.dp,
            tensor_parallel=options.tp,
            sequence_parallel=options.sequence_parallel,
            zero_stage=options.zero,
        )
        result = recommend(
            model, setup, int(options.gpu_memory_gib * (1 << 30)), options.gpu_tflops
        )
        flops = step_flops(model, result.setup)
    except (SizingError, ValueError) as invalid:
        print(f"trainwave size: {invalid}", file=sys.stderr)
        return 2
    if options.json:
        print(json.dumps(render_json(model, result, flops), indent=2))
    else:
        print(render_text(model, result, flops))
    return 0 if result.mode != "none" else 1


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


if __name__ == "__main__":
    sys.exit(main())
