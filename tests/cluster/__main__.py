"""`python -m cluster {up,down,status,env}`: the local control plane from a shell.

Run from tests/ (the Makefile does `cd tests && python -m cluster up`). The state
dir is $TRAINWAVE_CLUSTER_DIR, else $TRAINWAVE_CACHE/cluster (~/.cache/trainwave).
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

from cluster.controlplane import (
    DEFAULT_TOPOLOGY,
    cache_dir,
    cluster_status,
    ensure_cluster,
    stop_cluster,
)
from cluster.topology import TopologyError, build_nodes, load_topology
from trainwave.contract import GPU_RESOURCE


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cluster", description=__doc__)
    parser.add_argument("--state-dir", type=Path, help="default: $TRAINWAVE_CLUSTER_DIR")
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser("up", help="start the cluster (idempotent) and apply a topology")
    up.add_argument("--topology", type=Path, default=DEFAULT_TOPOLOGY, help="topology YAML")
    up.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for readiness")
    up.add_argument(
        "--real-nodes",
        type=int,
        default=None,
        help="real kubelets beside the kwok nodes (0 to 4; needs root); default: keep what runs",
    )
    commands.add_parser("down", help="stop every process and delete the state dir")
    commands.add_parser("status", help="show the components; exit 0 only when healthy")
    commands.add_parser("env", help="print shell exports for KUBECONFIG and the pinned tools")
    args = parser.parse_args(argv)
    try:
        return _COMMANDS[args.command](args)
    except (TopologyError, FileNotFoundError, RuntimeError, TimeoutError) as error:
        print(f"cluster {args.command} failed: {error}", file=sys.stderr)
        return 1


def _up(args: argparse.Namespace) -> int:
    began = time.monotonic()
    nodes = build_nodes(load_topology(args.topology))
    cluster = ensure_cluster(
        args.topology, args.state_dir, args.timeout, real_nodes=args.real_nodes
    )
    gpus = sum(int(n["status"]["capacity"].get(GPU_RESOURCE, 0)) for n in nodes)
    how = "started" if cluster.started else "already running"
    changes = cluster.nodes
    print(
        f"cluster {how}, ready in {time.monotonic() - began:.1f}s: {len(nodes)} nodes "
        f"({gpus} GPUs; {changes.created} created, {changes.replaced} replaced, "
        f"{changes.deleted} deleted) at {cluster.server}; KUBECONFIG={cluster.kubeconfig}"
    )
    if cluster.real_nodes:
        print(f"real nodes: {', '.join(cluster.real_nodes)}")
    return 0


def _down(args: argparse.Namespace) -> int:
    began = time.monotonic()
    was_running = stop_cluster(args.state_dir)
    what = "stopped and removed" if was_running else "nothing was running; state removed"
    print(f"cluster {what} in {time.monotonic() - began:.1f}s")
    return 0


def _status(args: argparse.Namespace) -> int:
    status = cluster_status(args.state_dir)
    if not status.components:
        print(f"no cluster in {status.state_dir}")
        return 1
    print(f"{'healthy' if status.healthy else 'UNHEALTHY'}: {status.server} ({status.state_dir})")
    print(f"topology: {status.topology or '-'}")
    for component in status.components:
        state = "running" if component.alive else "DOWN"
        print(f"  {component.name:<24} pid {component.pid:<8} {state:<8} {component.log}")
    return 0 if status.healthy else 1


def _env(args: argparse.Namespace) -> int:
    status = cluster_status(args.state_dir)
    print(f"export KUBECONFIG={shlex.quote(str(status.kubeconfig))}")
    print(f'export PATH={shlex.quote(str(cache_dir() / "bin"))}:"$PATH"')
    return 0


_COMMANDS = {"up": _up, "down": _down, "status": _status, "env": _env}

if __name__ == "__main__":
    sys.exit(main())
