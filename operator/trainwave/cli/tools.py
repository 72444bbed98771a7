"""The subcommands for people: `plan` (dry-run placement), `doctor` (GPUDirect RDMA
checklist), `size` (memory and FLOPs of a training step) and `logs` (a job's workers, by rank)."""

import argparse
import sys

from trainwave.cli.arguments import SubCommands


def add_plan_parser(commands: SubCommands) -> None:
    planner = commands.add_parser("plan", help="dry-run placement of a TrainingJob manifest")
    planner.add_argument("manifest", help="a TrainingJob YAML file")
    planner.add_argument(
        "--topology-levels",
        default="",
        help="comma-separated node labels, highest level first (default: spine, rack, host)",
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


def add_doctor_parser(commands: SubCommands) -> None:
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


def add_size_parser(commands: SubCommands) -> None:
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


def add_logs_parser(commands: SubCommands) -> None:
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
