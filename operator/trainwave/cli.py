"""`trainwave`: the command the operator image runs, and tools for people.

trainwave operator [--namespace NS]... [--metrics-port N] [--health-port N]
trainwave doctor [--root /] [--json] [--nccl-log FILE]...   GPUDirect RDMA checklist
trainwave crd            print the TrainingJob CRD the models define
trainwave version
"""

import argparse
import logging
import sys

from trainwave import __version__, contract

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
        help="comma-separated node labels, highest level first (used by placement)",
    )
    planner = commands.add_parser("plan", help="dry-run placement of a TrainingJob manifest")
    planner.add_argument("manifest", help="a TrainingJob YAML file")
    planner.add_argument(
        "--topology-levels",
        default="",
        help="comma-separated node labels, highest level first (default: spine, rack, host)",
    )
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
    if options.command == "doctor":
        return run_doctor(options)
    return run_operator(options)


def run_plan(options: argparse.Namespace) -> int:
    import yaml

    from trainwave.api.trainingjob import InvalidSpec
    from trainwave.controller.kube import load_config
    from trainwave.controller.planning import plan, render
    from trainwave.placement.gang import Placement
    from trainwave.placement.topology import DEFAULT_LEVELS

    with open(options.manifest) as stream:
        manifest = yaml.safe_load(stream)
    levels = [x for x in options.topology_levels.split(",") if x] or list(DEFAULT_LEVELS)
    try:
        result = plan(manifest, load_config(pool_size=2), levels)
    except InvalidSpec as invalid:
        print(f"{options.manifest}: invalid: {invalid}", file=sys.stderr)
        return 2
    print(render(result))
    return 0 if isinstance(result, Placement) else 1


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


def run_operator(options: argparse.Namespace) -> int:
    import kopf

    from trainwave.controller import handlers

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
    kopf.run(
        standalone=True,
        clusterwide=not options.namespace,
        namespaces=options.namespace,
        liveness_endpoint=f"http://{options.health_host}:{options.health_port}/healthz",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
