"""`trainwave`: the command the operator image runs, and tools for people.

trainwave operator [--namespace NS]... [--metrics-port N] [--health-port N] [--leader-elect ...]
trainwave agent [--node-name N] [--root DIR] [--interval S] [--once] [--shared-gpus ...]
trainwave doctor [--root /] [--json] [--nccl-log FILE]...   GPUDirect RDMA checklist
trainwave crd            print the TrainingJob CRD the models define
trainwave size           per-GPU memory and FLOPs of a training step; whole or shared GPUs
trainwave logs JOB [-n NS] [--attempt N] [--rank R] [-f]   the gang's worker logs, by rank
trainwave version

This module parses the command line and dispatches; each subcommand's flags and run live
by role: operator.py (the controller), agent.py (the node agent), tools.py (plan, doctor,
size, logs), and arguments.py holds what they share.
"""

import argparse
import sys

from trainwave import __version__
from trainwave.cli.agent import add_agent_parser, run_agent
from trainwave.cli.operator import add_operator_parser, run_operator
from trainwave.cli.tools import (
    add_doctor_parser,
    add_logs_parser,
    add_plan_parser,
    add_size_parser,
    run_doctor,
    run_logs,
    run_plan,
    run_size,
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="trainwave", description="trainwave operator and tools")
    commands = parser.add_subparsers(dest="command", required=True)

    add_operator_parser(commands)
    add_plan_parser(commands)
    add_agent_parser(commands)
    add_doctor_parser(commands)
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
