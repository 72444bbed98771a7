"""Argument types and choices the subcommand modules share."""

import argparse
from typing import TypeAlias

LOG_LEVELS = ("debug", "info", "warning", "error")

# The object `add_subparsers()` returns: each subcommand module adds its parser to it.
SubCommands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number of seconds above 0")
    return value
