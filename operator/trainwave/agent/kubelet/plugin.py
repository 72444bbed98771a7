"""The agent as the kubelet plugin of DRA driver gpu.trainwave.io: two unix sockets, gRPC.

Mirrors k8s.io/dynamic-resource-allocation kubeletplugin (v0.34.4):
- `<registry>/gpu.trainwave.io-reg.sock` serves pluginregistration.Registration:
  the kubelet's plugin watcher finds the socket, asks GetInfo (type DRAPlugin,
  the driver name, the DRA endpoint, supported service `v1.DRAPlugin`) and
  reports the outcome with NotifyRegistrationStatus;
- `<plugins>/gpu.trainwave.io/dra.sock` serves k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin:
  NodePrepareResources reads each claim from the API server and answers its
  devices' CDI ids (prepare.py); NodeUnprepareResources has nothing to undo,
  since preparing changes nothing on the node.

The messages and servicers are generated from the kubelet's .proto files
(gen/, written by hack/protos.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from trainwave import contract
from trainwave.agent.kubelet.gen import dra_v1_pb2 as dra
from trainwave.agent.kubelet.gen import dra_v1_pb2_grpc as dra_grpc
from trainwave.agent.kubelet.gen import pluginregistration_v1_pb2 as registration
from trainwave.agent.kubelet.gen import pluginregistration_v1_pb2_grpc as registration_grpc
from trainwave.agent.kubelet.prepare import prepare_claim

logger = logging.getLogger(__name__)

DEFAULT_KUBELET_DIR = Path("/var/lib/kubelet")
# What GetInfo lists as supported: the service names the kubelet may call.
SUPPORTED_VERSIONS = ("v1.DRAPlugin",)
PLUGIN_TYPE = "DRAPlugin"

# namespace, name -> the ResourceClaim as the API server has it; None when it is gone.
ReadClaim = Callable[[str, str], Mapping[str, Any] | None]


def registration_socket(kubelet_dir: Path) -> Path:
    return kubelet_dir / "plugins_registry" / f"{contract.DRA_DRIVER}-reg.sock"


def dra_socket(kubelet_dir: Path) -> Path:
    return kubelet_dir / "plugins" / contract.DRA_DRIVER / "dra.sock"


class KubeletPlugin:
    def __init__(
        self,
        node: str,
        read_claim: ReadClaim,
        kubelet_dir: Path = DEFAULT_KUBELET_DIR,
        on_registered: Callable[[], None] | None = None,
    ):
        """`on_registered` runs each time the kubelet registers the plugin: a kubelet that
        starts deletes every ResourceSlice of its node (v1.34.4 DRAPluginManager, so pods
        do not wait on drivers that may never return), then finds the socket again."""
        self.node = node
        self.read_claim = read_claim
        self.on_registered = on_registered
        self.registration = registration_socket(kubelet_dir)
        self.endpoint = dra_socket(kubelet_dir)
        self.registered: registration.RegistrationStatus | None = None
        self._server: grpc.Server | None = None

    def start(self) -> None:
        for socket in (self.registration, self.endpoint):
            socket.parent.mkdir(parents=True, exist_ok=True)
            socket.unlink(missing_ok=True)  # left by an earlier agent on this node
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        # grpcio-tools types the messages (*_pb2.pyi) but not these two functions.
        registration_grpc.add_RegistrationServicer_to_server(_Registration(self), server)  # type: ignore[no-untyped-call]
        dra_grpc.add_DRAPluginServicer_to_server(_DRAPlugin(self), server)  # type: ignore[no-untyped-call]
        for socket in (self.registration, self.endpoint):
            server.add_insecure_port(f"unix://{socket}")
        server.start()
        self._server = server
        logger.info(
            "kubelet plugin %s: registration %s, service %s",
            contract.DRA_DRIVER, self.registration, self.endpoint,
        )  # fmt: skip

    def stop(self, grace: float = 1.0) -> None:
        if self._server is not None:
            self._server.stop(grace).wait()
            self._server = None
        for socket in (self.registration, self.endpoint):
            socket.unlink(missing_ok=True)

    def info(self) -> registration.PluginInfo:
        return registration.PluginInfo(
            type=PLUGIN_TYPE,
            name=contract.DRA_DRIVER,
            endpoint=str(self.endpoint),
            supported_versions=SUPPORTED_VERSIONS,
        )

    def notified(self, status: registration.RegistrationStatus) -> None:
        self.registered = status
        if status.plugin_registered:
            logger.info("kubelet plugin %s: registered with the kubelet", contract.DRA_DRIVER)
            if self.on_registered is not None:
                self.on_registered()
        else:
            logger.error(
                "kubelet plugin %s: registration refused: %s", contract.DRA_DRIVER, status.error
            )

    def prepare(self, request: dra.NodePrepareResourcesRequest) -> dra.NodePrepareResourcesResponse:
        response = dra.NodePrepareResourcesResponse()
        for claim in request.claims:
            try:
                stored = self.read_claim(claim.namespace, claim.name)
            except Exception as error:  # the kubelet retries; it must hear why
                response.claims[claim.uid].error = f"reading the claim: {error}"
                continue
            prepared = prepare_claim(claim, stored, self.node)
            response.claims[claim.uid].CopyFrom(prepared)
            logger.info(
                "claim=%s/%s prepared devices=%s error=%r", claim.namespace, claim.name,
                [d.device_name for d in prepared.devices], prepared.error,
            )  # fmt: skip
        return response

    def unprepare(
        self, request: dra.NodeUnprepareResourcesRequest
    ) -> dra.NodeUnprepareResourcesResponse:
        """Nothing to undo: preparing changed nothing on the node. Every claim asked for gets
        an entry, as the API requires, with no error."""
        return dra.NodeUnprepareResourcesResponse(
            claims={claim.uid: dra.NodeUnprepareResourceResponse() for claim in request.claims}
        )


class _Registration(registration_grpc.RegistrationServicer):
    """pluginregistration.Registration, served on the registration socket."""

    def __init__(self, plugin: KubeletPlugin):
        self.plugin = plugin

    def GetInfo(  # noqa: N802 (the generated servicer's method name)
        self, request: registration.InfoRequest, context: grpc.ServicerContext
    ) -> registration.PluginInfo:
        return self.plugin.info()

    def NotifyRegistrationStatus(  # noqa: N802
        self, request: registration.RegistrationStatus, context: grpc.ServicerContext
    ) -> registration.RegistrationStatusResponse:
        self.plugin.notified(request)
        return registration.RegistrationStatusResponse()


class _DRAPlugin(dra_grpc.DRAPluginServicer):
    """k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin, served on the DRA socket."""

    def __init__(self, plugin: KubeletPlugin):
        self.plugin = plugin

    def NodePrepareResources(  # noqa: N802
        self, request: dra.NodePrepareResourcesRequest, context: grpc.ServicerContext
    ) -> dra.NodePrepareResourcesResponse:
        return self.plugin.prepare(request)

    def NodeUnprepareResources(  # noqa: N802
        self, request: dra.NodeUnprepareResourcesRequest, context: grpc.ServicerContext
    ) -> dra.NodeUnprepareResourcesResponse:
        return self.plugin.unprepare(request)
