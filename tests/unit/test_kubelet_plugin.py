"""The kubelet side of the shared-GPU DRA driver: the plugin's gRPC services, prepare, CDI.

The messages and servicers are generated from the kubelet's .proto files (hack/protos.py);
these tests call the plugin over a real unix socket with the generated client stubs. That
the generated code speaks what the kubelet speaks is checked end to end with the kubelet's
own Go client (tests/integration/test_gpu_claims.py, draclient).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import grpc
import pytest

from trainwave.agent.kubelet.cdi import SPEC_FILE, cdi_spec, write_cdi_spec
from trainwave.agent.kubelet.gen import dra_v1_pb2 as dra
from trainwave.agent.kubelet.gen import dra_v1_pb2_grpc as dra_grpc
from trainwave.agent.kubelet.gen import pluginregistration_v1_pb2 as registration
from trainwave.agent.kubelet.gen import pluginregistration_v1_pb2_grpc as registration_grpc
from trainwave.agent.kubelet.plugin import KubeletPlugin
from trainwave.agent.kubelet.prepare import prepare_claim
from trainwave.hardware.inventory import GpuInfo

pytestmark = pytest.mark.timeout(10)

CLAIM = dra.Claim(namespace="team", uid="uid-1", name="worker-0-gpu")


def test_a_claim_encodes_with_the_upstream_field_numbers() -> None:
    # Field 1 (namespace), 2 (uid), 3 (name), each length-delimited: stripping the gogo
    # options (hack/protos.py) must leave the wire format as k8s.io/kubelet has it.
    assert CLAIM.SerializeToString() == b"\x0a\x04team\x12\x05uid-1\x1a\x0cworker-0-gpu"


def test_the_services_carry_the_names_the_kubelet_calls() -> None:
    assert dra.DESCRIPTOR.services_by_name["DRAPlugin"].full_name == (
        "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"
    )
    assert registration.DESCRIPTOR.services_by_name["Registration"].full_name == (
        "pluginregistration.Registration"
    )


def allocated(node: str = "node-a", driver: str = "gpu.trainwave.io") -> dict[str, Any]:
    result = {"request": "gpu", "driver": driver, "pool": node, "device": "gpu-1", "shareID": "s"}
    return {
        "metadata": {"uid": "uid-1"},
        "status": {"allocation": {"devices": {"results": [result]}}},
    }


def test_prepare_answers_the_allocated_device_as_a_cdi_id() -> None:
    prepared = prepare_claim(CLAIM, allocated(), "node-a")
    assert prepared == dra.NodePrepareResourceResponse(
        devices=[
            dra.Device(
                request_names=["gpu"],
                pool_name="node-a",
                device_name="gpu-1",
                cdi_device_ids=["trainwave.io/gpu=gpu-1"],
            )
        ]
    )


REFUSED = {
    "gone": (None, "not found"),
    "other-uid": ({**allocated(), "metadata": {"uid": "uid-9"}}, "has UID uid-9"),
    "unallocated": ({"metadata": {"uid": "uid-1"}}, "no device of driver gpu.trainwave.io"),
    "other-driver": (allocated(driver="gpu.nvidia.com"), "no device of driver"),
    "other-node": (allocated(node="node-b"), "pool(s) ['node-b'], not on node node-a"),
}


@pytest.mark.parametrize(("stored", "message"), REFUSED.values(), ids=REFUSED.keys())
def test_prepare_refuses_naming_the_claim_and_why(stored: Any, message: str) -> None:
    prepared = prepare_claim(CLAIM, stored, "node-a")
    assert not prepared.devices
    assert "ResourceClaim team/worker-0-gpu" in prepared.error
    assert message in prepared.error


@pytest.fixture
def plugin() -> Iterator[KubeletPlugin]:
    """The plugin serving on unix sockets under a short directory (a socket path must fit
    in 108 bytes), reading claims from a dict."""
    claims: dict[tuple[str, str], Mapping[str, Any]] = {("team", "worker-0-gpu"): allocated()}

    def read_claim(namespace: str, name: str) -> Mapping[str, Any] | None:
        if name == "unreadable":
            raise RuntimeError("the API server is away")
        return claims.get((namespace, name))

    with tempfile.TemporaryDirectory(dir="/tmp") as kubelet_dir:
        served = KubeletPlugin("node-a", read_claim, Path(kubelet_dir))
        served.start()
        try:
            yield served
        finally:
            served.stop(grace=0)


def test_the_plugin_registers_and_prepares_over_grpc(plugin: KubeletPlugin) -> None:
    with grpc.insecure_channel(f"unix://{plugin.registration}") as channel:
        registry = registration_grpc.RegistrationStub(channel)
        info = registry.GetInfo(registration.InfoRequest(), timeout=5)
        registry.NotifyRegistrationStatus(
            registration.RegistrationStatus(plugin_registered=True), timeout=5
        )
    assert info == registration.PluginInfo(
        type="DRAPlugin",
        name="gpu.trainwave.io",
        endpoint=str(plugin.endpoint),
        supported_versions=["v1.DRAPlugin"],
    )
    assert plugin.registered == registration.RegistrationStatus(plugin_registered=True)

    unreadable = dra.Claim(namespace="team", uid="uid-2", name="unreadable")
    gone = dra.Claim(namespace="team", uid="uid-3", name="gone")
    with grpc.insecure_channel(f"unix://{info.endpoint}") as channel:
        service = dra_grpc.DRAPluginStub(channel)
        prepared = service.NodePrepareResources(
            dra.NodePrepareResourcesRequest(claims=[CLAIM, unreadable, gone]), timeout=5
        )
        unprepared = service.NodeUnprepareResources(
            dra.NodeUnprepareResourcesRequest(claims=[CLAIM, gone]), timeout=5
        )
    assert prepared.claims["uid-1"] == prepare_claim(CLAIM, allocated(), "node-a")
    assert prepared.claims["uid-2"].error == "reading the claim: the API server is away"
    assert prepared.claims["uid-3"].error == "ResourceClaim team/gone not found"
    # Every claim asked for gets an entry, as the API requires; nothing to undo.
    assert dict(unprepared.claims) == {
        "uid-1": dra.NodeUnprepareResourceResponse(),
        "uid-3": dra.NodeUnprepareResourceResponse(),
    }


def test_each_registration_calls_back_a_refusal_does_not(plugin: KubeletPlugin) -> None:
    """The agent publishes again when the kubelet registers the plugin: a kubelet that
    (re)starts has deleted the node's ResourceSlices."""
    calls: list[str] = []
    plugin.on_registered = lambda: calls.append("registered")
    with grpc.insecure_channel(f"unix://{plugin.registration}") as channel:
        registry = registration_grpc.RegistrationStub(channel)
        for registered in (True, False, True):
            registry.NotifyRegistrationStatus(
                registration.RegistrationStatus(plugin_registered=registered), timeout=5
            )
    assert calls == ["registered", "registered"]


def test_a_refused_registration_is_kept(plugin: KubeletPlugin) -> None:
    with grpc.insecure_channel(f"unix://{plugin.registration}") as channel:
        registration_grpc.RegistrationStub(channel).NotifyRegistrationStatus(
            registration.RegistrationStatus(plugin_registered=False, error="version"), timeout=5
        )
    assert plugin.registered is not None
    assert (plugin.registered.plugin_registered, plugin.registered.error) == (False, "version")


def test_the_cdi_spec_hands_each_device_its_gpu_and_is_rewritten_only_on_change(
    tmp_path: Path,
) -> None:
    gpus = [GpuInfo(i, f"GPU-{i}", "H100", 81559, f"0000:{i:02x}:00.0", 0) for i in (0, 3)]
    spec = cdi_spec(gpus)
    assert spec["kind"] == "trainwave.io/gpu"
    assert [d["name"] for d in spec["devices"]] == ["gpu-0", "gpu-3"]
    assert spec["devices"][1]["containerEdits"] == {"env": ["NVIDIA_VISIBLE_DEVICES=GPU-3"]}
    assert write_cdi_spec(tmp_path, gpus)
    assert json.loads((tmp_path / SPEC_FILE).read_text()) == spec
    assert not write_cdi_spec(tmp_path, gpus), "unchanged: not rewritten"
    assert write_cdi_spec(tmp_path, gpus[:1])
