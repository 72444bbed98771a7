"""`trainwave agent`: the node agent's flags and its run loop (publishing the node's GPUs,
NICs and shared GPU memory; optionally the kubelet DRA plugin and the ResourceSlice watch)."""

import argparse
import logging
import os
import sys
from pathlib import Path

from trainwave import contract
from trainwave.cli.arguments import LOG_LEVELS, SubCommands, positive_seconds


def add_agent_parser(commands: SubCommands) -> None:
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
        "--interval", type=positive_seconds, default=60.0, help="seconds between passes"
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


def _shared_gpus(text: str) -> object:
    from trainwave.agent.sharing import SharingError, parse_selection

    try:
        return parse_selection(text)
    except SharingError as error:
        raise argparse.ArgumentTypeError(str(error)) from error
