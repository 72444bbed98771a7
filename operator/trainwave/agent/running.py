"""The agent's pass: discover, describe, publish; once or every `interval` seconds.

A pass that fails (no NVML, a bad `--shared-gpus`, the API server refusing or
unreachable) is logged with its reason and tried again on the next interval:
the DaemonSet pod stays up instead of crash-looping through a transient
error, and recovers on its own once the cause is gone. Nothing is published
from a pass whose discovery failed, so a broken driver never strips a node's
labels.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from trainwave.agent.changes import Change, DesiredNode
from trainwave.agent.discovery import discover
from trainwave.agent.fake_gpus import FakeGpusError, load_fake_gpus
from trainwave.agent.files import replace_if_changed
from trainwave.agent.kubelet.cdi import write_cdi_spec
from trainwave.agent.labels import build_annotations, build_labels
from trainwave.agent.nvml import GpuBackend, GpuBackendError, NvmlBackend
from trainwave.agent.sharing import (
    SharedSelection,
    SharingError,
    shared_gpus,
    shared_memory_mib,
)
from trainwave.contract import ARBITER_GPUS_FILE, SHARED_GPU_MEMORY_RESOURCE
from trainwave.hardware.inventory import GpuInfo, NodeInventory

logger = logging.getLogger(__name__)
MIB = 1 << 20

Publish = Callable[[DesiredNode], Sequence[Change]]


class PassError(RuntimeError):
    """One pass failed; the message names the cause. The next pass may succeed."""


# What a pass can run into that a later pass may not: each becomes a logged
# PassError. Anything else is a bug and is allowed to crash the process.
RECOVERABLE: tuple[type[Exception], ...] = (GpuBackendError, FakeGpusError, SharingError)


@dataclass(frozen=True)
class AgentOptions:
    node_name: str
    root: Path = Path("/")
    shared: SharedSelection = field(default_factory=SharedSelection)
    fake_gpus: Path | None = None  # a JSON file instead of NVML (fake_gpus.py)
    arbiter_dir: Path | None = None  # where the arbiter container reads the shared GPUs
    gpu_slices: bool = False  # publish the shared GPUs as DRA ResourceSlices (slices.py)
    cdi_dir: Path | None = None  # where the kubelet plugin's CDI spec goes (kubelet/cdi.py)


def desired_node(
    inventory: NodeInventory,
    node_name: str,
    selection: SharedSelection,
    *,
    gpu_slices: bool = False,
) -> DesiredNode:
    """Labels, the inventory annotation and the shared-memory resource of one node.

    Every node is its own NVLink domain here (HGX boards); multi-node NVLink
    cliques will name the clique instead.
    """
    shared = shared_gpus(selection, inventory.gpus)
    return DesiredNode(
        labels=build_labels(inventory, nvlink_domain=node_name),
        annotations=build_annotations(inventory, shared),
        resources={SHARED_GPU_MEMORY_RESOURCE: shared_memory_mib(shared)} if shared else {},
        slices=shared if gpu_slices else None,
    )


@contextmanager
def open_backend(options: AgentOptions) -> Iterator[GpuBackend]:
    """The fake GPUs when a file is given, else NVML (opened and shut down per pass)."""
    if options.fake_gpus is not None:
        yield load_fake_gpus(options.fake_gpus)
        return
    with NvmlBackend() as backend:
        yield backend


def write_arbiter_gpus(directory: Path, gpus: Sequence[GpuInfo]) -> bool:
    """The shared GPUs and their bytes for the node's arbiter (runtime/submodel/
    arbiter.py serves one socket per entry); rewritten only when it changes, and
    atomically, so the arbiter never reads half a file. True when written."""
    path = directory / ARBITER_GPUS_FILE
    content = json.dumps({gpu.uuid: gpu.memory_mib * MIB for gpu in gpus}, sort_keys=True)
    if not replace_if_changed(path, content):
        return False
    logger.info("arbiter: %d shared GPU(s) written to %s", len(gpus), path)
    return True


class Agent:
    def __init__(
        self,
        options: AgentOptions,
        publish: Publish,
        publish_errors: tuple[type[Exception], ...] = (),
    ) -> None:
        """`publish_errors`: what `publish` raises for a refused or failed API call."""
        self.options = options
        self.publish = publish
        self.publish_errors = publish_errors
        self._problems: tuple[str, ...] = ()

    def run_pass(self) -> tuple[Change, ...]:
        """One pass; raises PassError with the reason when it could not finish."""
        try:
            with open_backend(self.options) as backend:
                inventory = discover(backend, self.options.root)
            desired = desired_node(
                inventory,
                self.options.node_name,
                self.options.shared,
                gpu_slices=self.options.gpu_slices,
            )
            self._report_problems(inventory.problems)
            if self.options.cdi_dir is not None:
                try:
                    if write_cdi_spec(
                        self.options.cdi_dir, shared_gpus(self.options.shared, inventory.gpus)
                    ):
                        logger.info("CDI spec written to %s", self.options.cdi_dir)
                except OSError as error:
                    raise PassError(f"CDI directory: {error}") from error
            if self.options.arbiter_dir is not None:
                shared = shared_gpus(self.options.shared, inventory.gpus)
                try:
                    write_arbiter_gpus(self.options.arbiter_dir, shared)
                except OSError as error:
                    raise PassError(f"arbiter directory: {error}") from error
            return tuple(self.publish(desired))
        except (*RECOVERABLE, *self.publish_errors) as error:
            raise PassError(str(error)) from error

    def run_once(self) -> bool:
        """One pass, logged; True when it finished."""
        try:
            changes = self.run_pass()
        except PassError as error:
            logger.error("node=%s pass failed: %s", self.options.node_name, error)
            return False
        # Each change was logged at INFO as it was made; a quiet pass stays quiet.
        logger.debug("node=%s pass done: %d change(s)", self.options.node_name, len(changes))
        return True

    def run_forever(
        self, interval: float, stop: threading.Event, wake: threading.Event | None = None
    ) -> None:
        """A pass every `interval` seconds until `stop` is set; failures wait for the next.
        Setting `wake` starts the next pass at once (set it with `stop` to stop at once)."""
        wake = wake or stop
        while not stop.is_set():
            self.run_once()
            if wake.wait(interval) and wake is not stop:
                wake.clear()

    def _report_problems(self, problems: tuple[str, ...]) -> None:
        """Discovery problems are logged when they change, not every pass."""
        if problems != self._problems:
            for problem in problems:
                logger.warning("node=%s discovery: %s", self.options.node_name, problem)
            self._problems = problems
