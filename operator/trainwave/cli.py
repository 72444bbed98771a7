"""`trainwave`: the command the operator image runs, and tools for people.

trainwave operator [--namespace NS]... [--metrics-port N] [--health-port N]
trainwave crd            print the TrainingJob CRD the models define
trainwave size           per-GPU memory and FLOPs of a training step; whole or shared GPUs
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
    add_size_parser(commands)
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
    if options.command == "size":
        return run_size(options)
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
        result = recommend(model, setup, int(options.gpu_memory_gib * (1 << 30)))
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
