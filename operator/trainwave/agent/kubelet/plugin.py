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
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from trainwave import contract
from trainwave.agent.kubelet import wire
from trainwave.agent.kubelet.prepare import prepare_claim

logger = logging.getLogger(__name__)

DEFAULT_KUBELET_DIR = Path("/var/lib/kubelet")
REGISTRATION_SERVICE = "pluginregistration.Registration"
DRA_SERVICE = "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"
# What GetInfo lists as supported: the service names the kubelet may call.
SUPPORTED_VERSIONS = ("v1.DRAPlugin",)
PLUGIN_TYPE = "DRAPlugin"

# namespace, name -> the ResourceClaim as the API server has it; None when it is gone.
ReadClaim = Callable[[str, str], Mapping[str, Any] | None]


def registration_socket(kubelet_dir: Path) -> Path:
    return kubelet_dir / "plugins_registry" / f"{contract.DRA_DRIVER}-reg.sock"


def dra_socket(kubelet_dir: Path) -> Path:
    return kubelet_dir / "plugins" / contract.DRA_DRIVER / "dra.sock"


def _raw(handler: Callable[[bytes, grpc.ServicerContext], bytes]) -> grpc.RpcMethodHandler:
    """Bytes in, bytes out: wire.py does the protobuf encoding."""
    return grpc.unary_unary_rpc_method_handler(
        handler, request_deserializer=None, response_serializer=None
    )


class KubeletPlugin:
    def __init__(self, node: str, read_claim: ReadClaim, kubelet_dir: Path = DEFAULT_KUBELET_DIR):
        self.node = node
        self.read_claim = read_claim
        self.registration = registration_socket(kubelet_dir)
        self.endpoint = dra_socket(kubelet_dir)
        self.registered: wire.RegistrationStatus | None = None
        self._server: grpc.Server | None = None

    def start(self) -> None:
        for socket in (self.registration, self.endpoint):
            socket.parent.mkdir(parents=True, exist_ok=True)
            socket.unlink(missing_ok=True)  # left by an earlier agent on this node
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    REGISTRATION_SERVICE,
                    {
                        "GetInfo": _raw(self._get_info),
                        "NotifyRegistrationStatus": _raw(self._notify),
                    },
                ),
                grpc.method_handlers_generic_handler(
                    DRA_SERVICE,
                    {
                        "NodePrepareResources": _raw(self._prepare),
                        "NodeUnprepareResources": _raw(self._unprepare),
                    },
                ),
            )
        )
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

    def _get_info(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        info = wire.PluginInfo(
            type=PLUGIN_TYPE,
            name=contract.DRA_DRIVER,
            endpoint=str(self.endpoint),
            supported_versions=SUPPORTED_VERSIONS,
        )
        return info.encode()

    def _notify(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        status = wire.RegistrationStatus.decode(request)
        self.registered = status
        if status.plugin_registered:
            logger.info("kubelet plugin %s: registered with the kubelet", contract.DRA_DRIVER)
        else:
            logger.error(
                "kubelet plugin %s: registration refused: %s", contract.DRA_DRIVER, status.error
            )
        return wire.empty()

    def _prepare(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        results: dict[str, wire.Prepared | wire.Unprepared] = {}
        for claim in wire.decode_claims(request):
            try:
                stored = self.read_claim(claim.namespace, claim.name)
            except Exception as error:  # the kubelet retries; it must hear why
                results[claim.uid] = wire.Prepared(error=f"reading the claim: {error}")
                continue
            results[claim.uid] = prepared = prepare_claim(claim, stored, self.node)
            logger.info(
                "claim=%s/%s prepared devices=%s error=%r", claim.namespace, claim.name,
                [d.device_name for d in prepared.devices], prepared.error,
            )  # fmt: skip
        return wire.ClaimResults(results).encode()

    def _unprepare(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        claims = wire.decode_claims(request)
        return wire.ClaimResults({claim.uid: wire.Unprepared() for claim in claims}).encode()
