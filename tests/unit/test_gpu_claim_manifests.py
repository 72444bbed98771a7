"""Shared GPUs through DRA, the pure parts: the agent's slices, the worker's claim, the status."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from factories import make_job

from cluster.inventory import inventory_annotation
from trainwave import contract
from trainwave.agent.slices import NodeRef, build_slices, gate_problem, plan_slices
from trainwave.api.sharing import isolation
from trainwave.builders.pods import build_worker_pods
from trainwave.builders.sharing import build_gpu_claim
from trainwave.controller.clusterview import ClusterIndex
from trainwave.hardware.inventory import GpuInfo
from trainwave.placement.records import (
    WHOLE_DEVICE_MIB,
    ClaimRecord,
    claim_record,
    node_record,
    pod_record,
)
from trainwave.resolving import resolve_job

pytestmark = pytest.mark.timeout(10)

NODE = NodeRef("gpu-7", "uid-7")
GPUS = tuple(GpuInfo(i, f"GPU-{i}", "NVIDIA H100", 81559, f"0000:{i:02x}:00.0", 0) for i in (0, 1))


def stored(slices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """As the API server returns them: with resourceVersions."""
    found = copy.deepcopy(slices)
    for index, item in enumerate(found):
        item["metadata"]["resourceVersion"] = str(100 + index)
    return found


def test_one_shareable_device_per_slice_with_the_gpus_memory_as_capacity() -> None:
    slices = build_slices(NODE, GPUS, generation=1)
    assert [s["metadata"]["name"] for s in slices] == ["gpu-7-gpu-0", "gpu-7-gpu-1"]
    for item, gpu in zip(slices, GPUS, strict=True):
        assert item["metadata"]["ownerReferences"] == [
            {"apiVersion": "v1", "kind": "Node", "name": "gpu-7", "uid": "uid-7"}
        ]
        spec = item["spec"]
        assert spec["pool"] == {"name": "gpu-7", "generation": 1, "resourceSliceCount": 2}
        [device] = spec["devices"]
        assert device["allowMultipleAllocations"] is True
        assert device["attributes"]["uuid"] == {"string": gpu.uuid}
        assert device["capacity"]["memory"]["value"] == "81559Mi"


def test_published_slices_that_match_send_nothing() -> None:
    assert not plan_slices(NODE, GPUS, stored(build_slices(NODE, GPUS, 3)))


@pytest.mark.parametrize(
    ("mib", "stored_as"),
    [(81559, "81559Mi"), (40960, "40Gi"), (81920, "80Gi"), (1536, "1536Mi"), (5, "5Mi"),
     (1 << 20, "1Ti")],
    ids=["h100-80gb", "a100-40gb", "a100-80gb", "not-whole-gib", "tiny", "tib"],
)  # fmt: skip
def test_memory_is_written_as_the_api_server_stores_it_so_a_pass_sends_nothing(
    mib: int, stored_as: str
) -> None:
    gpus = (GpuInfo(0, "GPU-0", "NVIDIA A100", mib, "0000:00:00.0", 0),)
    [item] = build_slices(NODE, gpus, 1)
    capacity = item["spec"]["devices"][0]["capacity"]["memory"]
    assert (capacity["value"], capacity["requestPolicy"]["default"]) == (stored_as, stored_as)
    assert not plan_slices(NODE, gpus, stored([item]))


def test_a_change_rewrites_the_pool_at_the_next_generation_and_drops_stale_slices() -> None:
    published = stored(build_slices(NODE, GPUS, 3))
    plan = plan_slices(NODE, GPUS[:1], published)
    assert [s["metadata"]["name"] for s in plan.write] == ["gpu-7-gpu-0"]
    assert plan.write[0]["spec"]["pool"]["generation"] == 4
    assert plan.write[0]["spec"]["pool"]["resourceSliceCount"] == 1
    assert plan.write[0]["metadata"]["resourceVersion"] == "100", "replaced, not created"
    assert plan.delete == ("gpu-7-gpu-1",)


def test_a_recreated_node_gets_its_slices_rewritten_for_the_new_owner() -> None:
    published = stored(build_slices(NodeRef("gpu-7", "old-uid"), GPUS, 1))
    plan = plan_slices(NODE, GPUS, published)
    assert {s["metadata"]["ownerReferences"][0]["uid"] for s in plan.write} == {"uid-7"}


def test_a_slice_stored_without_sharing_names_the_feature_gate() -> None:
    [item, _] = build_slices(NODE, GPUS, 1)
    assert gate_problem(item) is None
    del item["spec"]["devices"][0]["allowMultipleAllocations"]
    problem = gate_problem(item)
    assert problem is not None
    assert "DRAConsumableCapacity" in problem
    assert "gpu-7-gpu-0" in problem


def shared_pod(gpu_claims: bool) -> dict[str, Any]:
    job = make_job(workers=1, gpuSharing={"memory": "20Gi"})
    [pod] = build_worker_pods(resolve_job(job, gpu_claims=gpu_claims), (0,), attempt=0)
    return pod


def test_a_shared_worker_references_its_claim_only_with_gpu_claims() -> None:
    assert "resourceClaims" not in shared_pod(False)["spec"]
    pod = shared_pod(True)
    name = pod["metadata"]["name"]
    assert pod["spec"]["resourceClaims"] == [
        {"name": contract.DRA_POD_CLAIM, "resourceClaimName": f"{name}-gpu"}
    ]
    worker = next(c for c in pod["spec"]["containers"] if c["name"] == contract.WORKER_CONTAINER)
    assert worker["resources"]["claims"] == [{"name": contract.DRA_POD_CLAIM}]
    # The node-wide resource stays: kube-scheduler checks both.
    assert worker["resources"]["limits"][contract.SHARED_GPU_MEMORY_RESOURCE] == 20480


def test_the_claim_selects_the_chosen_gpu_with_the_workers_memory_and_is_owned_by_the_pod() -> None:
    pod = shared_pod(True)
    pod["metadata"] |= {"namespace": "team", "uid": "pod-uid", "resourceVersion": "5"}
    record = pod_record(pod)
    assert record is not None
    assert record.release_basis is not None
    claim = build_gpu_claim(record.release_basis, "GPU-abc", 20480)
    assert claim is not None
    assert claim["metadata"]["name"] == f"{pod['metadata']['name']}-gpu"
    assert claim["metadata"]["namespace"] == "team"
    assert claim["metadata"]["ownerReferences"][0]["uid"] == "pod-uid"
    [request] = claim["spec"]["devices"]["requests"]
    exactly = request["exactly"]
    assert exactly["deviceClassName"] == contract.DRA_DEVICE_CLASS
    assert exactly["count"] == 1
    assert exactly["capacity"] == {"requests": {"memory": "20480Mi"}}
    assert exactly["selectors"] == [
        {"cel": {"expression": 'device.attributes["gpu.trainwave.io"].uuid == "GPU-abc"'}}
    ]


def test_a_worker_built_without_a_claim_gets_none() -> None:
    pod = shared_pod(False)
    pod["metadata"] |= {"namespace": "team", "uid": "pod-uid"}
    record = pod_record(pod)
    assert record is not None
    assert record.release_basis is not None
    assert build_gpu_claim(record.release_basis, "GPU-abc", 20480) is None


def test_isolation_says_per_gpu_accounting_only_when_configured() -> None:
    job = make_job(workers=1, gpuSharing={"memory": "20Gi"})
    with_claims = isolation(resolve_job(job, gpu_claims=True).setup)
    without = isolation(resolve_job(job).setup)
    assert "a DRA ResourceClaim takes 20480 MiB of the placed GPU's memory" in with_claims
    assert "accounts trainwave.io/gpu-memory per node" in without
    assert "DRA" not in without


def raw_claim(
    device: str = "gpu-1",
    consumed: str | None = "20Gi",
    *,
    driver: str = "gpu.trainwave.io",
    worker: bool = False,
    allocated: bool = True,
) -> dict[str, Any]:
    result: dict[str, Any] = {"request": "gpu", "driver": driver, "pool": "gpu-7", "device": device}
    if consumed is not None:
        result |= {"shareID": "5f1e8b4a-0000-4000-8000-000000000001"}
        result["consumedCapacity"] = {"memory": consumed}
    labels = {contract.LABEL_ROLE: contract.ROLE_WORKER} if worker else {}
    status = {"allocation": {"devices": {"results": [result]}}} if allocated else {}
    return {"metadata": {"name": "c", "namespace": "ns", "labels": labels}, "status": status}


CLAIMS = {
    "share": (raw_claim(), ClaimRecord((("gpu-7", 1, 20480),))),
    "rounded-up": (raw_claim(consumed="1500Ki"), ClaimRecord((("gpu-7", 1, 2),))),
    "whole-device": (raw_claim(consumed=None), ClaimRecord((("gpu-7", 1, WHOLE_DEVICE_MIB),))),
    "a-workers-own": (raw_claim(worker=True), None),
    "not-allocated": (raw_claim(allocated=False), None),
    "another-driver": (raw_claim(driver="gpu.nvidia.com"), None),
    "odd-device-name": (raw_claim(device="nic-0"), None),
}


@pytest.mark.parametrize(("claim", "expected"), CLAIMS.values(), ids=CLAIMS.keys())
def test_placement_keeps_what_a_foreign_claim_holds(claim: Any, expected: Any) -> None:
    assert claim_record(claim) == expected


def test_the_packer_sees_memory_held_by_claims_it_did_not_make() -> None:
    node = {
        "metadata": {
            "name": "gpu-7",
            "annotations": inventory_annotation(
                "gpu-7", gpus=2, product="H100", memory_mib=81559, nics=0, link_layer=None,
                rate_gbps=0, gpu_direct=False, shared=True,
            ),
        },
        "status": {"allocatable": {contract.GPU_RESOURCE: "2"}},
    }  # fmt: skip
    index = ClusterIndex()
    index.put_node("gpu-7", node_record(node))
    [gpu0, gpu1] = index.node("gpu-7").shared  # type: ignore[union-attr]
    index.put_claim("ns/hog", claim_record(raw_claim("gpu-1", "60Gi")))
    assert index.view().usage["gpu-7"].gpu_mib == {gpu1.uuid: 61440}
    snapshot = index.view().snapshot()
    [info] = snapshot.nodes
    assert {g.uuid: g.used_mib for g in info.shared} == {gpu0.uuid: 0, gpu1.uuid: 61440}
    index.put_claim("ns/hog", None)
    assert "gpu-7" not in index.view().usage, "released: nothing held"
    assert index.counts["resourceclaims"] == 0
