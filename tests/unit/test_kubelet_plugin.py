"""The kubelet side of the shared-GPU DRA driver, the pure parts: wire format, prepare, CDI.

The encoding is also checked end to end against the kubelet's own generated Go clients
(tests/integration/test_gpu_claims.py, draclient); these pin single messages to bytes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from trainwave.agent.kubelet import wire
from trainwave.agent.kubelet.cdi import SPEC_FILE, cdi_spec, write_cdi_spec
from trainwave.agent.kubelet.prepare import prepare_claim
from trainwave.hardware.inventory import GpuInfo

pytestmark = pytest.mark.timeout(10)

CLAIM = wire.Claim("team", "uid-1", "worker-0-gpu")


def test_a_claim_encodes_as_protoc_would() -> None:
    # Field 1 (namespace), 2 (uid), 3 (name), each length-delimited (wire type 2).
    assert CLAIM.encode() == b"\x0a\x04team\x12\x05uid-1\x1a\x0cworker-0-gpu"
    assert wire.decode_claims(wire.encode_claims([CLAIM, CLAIM])) == (CLAIM, CLAIM)


def test_default_scalars_are_left_out_and_booleans_are_varints() -> None:
    assert wire.RegistrationStatus(False).encode() == b""
    assert wire.RegistrationStatus(True, "x").encode() == b"\x08\x01\x12\x01x"
    assert wire.RegistrationStatus.decode(b"\x08\x01\x12\x01x") == wire.RegistrationStatus(
        True, "x"
    )


def test_plugin_info_and_prepared_results_round_trip() -> None:
    info = wire.PluginInfo("DRAPlugin", "gpu.trainwave.io", "/p/dra.sock", ("v1.DRAPlugin",))
    assert wire.PluginInfo.decode(info.encode()) == info
    device = wire.Device(("gpu",), "node-a", "gpu-1", ("trainwave.io/gpu=gpu-1",))
    results = {"uid-1": wire.Prepared((device,)), "uid-2": wire.Prepared(error="gone")}
    encoded = wire.ClaimResults(results).encode()
    assert wire.decode_results(encoded, wire.Prepared) == results


def test_unknown_fields_are_skipped_and_truncation_is_an_error() -> None:
    # Field 9 as a varint, field 10 as fixed64: a newer kubelet's additions.
    extra = b"\x48\x05" + b"\x51" + b"\x00" * 8
    assert wire.Claim.decode(CLAIM.encode() + extra) == CLAIM
    with pytest.raises(wire.WireError, match="bytes announced"):
        wire.decode_claims(wire.encode_claims([CLAIM])[:-3])


def allocated(node: str = "node-a", driver: str = "gpu.trainwave.io") -> dict[str, Any]:
    result = {"request": "gpu", "driver": driver, "pool": node, "device": "gpu-1", "shareID": "s"}
    return {
        "metadata": {"uid": "uid-1"},
        "status": {"allocation": {"devices": {"results": [result]}}},
    }


def test_prepare_answers_the_allocated_device_as_a_cdi_id() -> None:
    prepared = prepare_claim(CLAIM, allocated(), "node-a")
    assert prepared == wire.Prepared(
        (wire.Device(("gpu",), "node-a", "gpu-1", ("trainwave.io/gpu=gpu-1",)),)
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
    assert prepared.devices == ()
    assert "ResourceClaim team/worker-0-gpu" in prepared.error
    assert message in prepared.error


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
