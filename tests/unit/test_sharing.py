"""Shared GPUs: the API block, the worker pod, per-GPU placement and the honest isolation."""

from __future__ import annotations

import json
from typing import Any

import pytest
from factories import NOW, make_job, make_pod

from cluster.inventory import inventory_annotation
from trainwave import contract
from trainwave.api.sharing import isolation, memory_bytes
from trainwave.api.status import Phase
from trainwave.api.trainingjob import InvalidSpec
from trainwave.builders.pods import build_worker_pods
from trainwave.lifecycle.decide import PlacementWait, decide
from trainwave.placement.sharing import (
    LARGER_THAN_ANY_GPU,
    NO_SHARED_GPUS,
    NOT_ENOUGH_GPU_MEMORY,
    Pin,
    SharedGpu,
    SharedNode,
    SharedRefusal,
    build_shared_nodes,
    place_shared,
)
from trainwave.resolving import resolve_job
from trainwave.sizing.memory import estimate_memory
from trainwave.sizing.recommend import recommend
from trainwave.sizing.requests import shared_memory
from trainwave.sizing.setup import TrainingSetup
from trainwave.sizing.shapes import preset

pytestmark = pytest.mark.timeout(20)
GPU = 81559  # MiB of one H100 80GB


def node(
    name: str, *used: int, model: str = "H100", labels: dict[str, str] | None = None
) -> SharedNode:
    gpus = tuple(SharedGpu(f"GPU-{name}-{i}", i, GPU, u) for i, u in enumerate(used))
    return SharedNode(name, model, gpus, labels=labels or {})


def placed(result: tuple[Pin, ...] | SharedRefusal) -> tuple[Pin, ...]:
    assert not isinstance(result, SharedRefusal), result
    return result


# --- the API and the pod ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [("20Gi", 20 * 2**30), ("500M", 500 * 10**6), (1048576, 2**20), ("1.5Gi", int(1.5 * 2**30))],
    ids=["Gi", "M", "bytes", "fraction"],
)
def test_memory_quantities(value: Any, expected: int) -> None:
    assert memory_bytes(value) == expected


def test_a_bad_memory_quantity_names_the_field_and_what_is_accepted() -> None:
    with pytest.raises(InvalidSpec, match=r"spec\.gpuSharing\.memory.*suffix Ki, Mi, Gi"):
        make_job(gpuSharing={"memory": "20 gigs"})


def test_a_shared_worker_asks_for_gpu_memory_not_gpus() -> None:
    job = make_job(workers=1, gpuSharing={"memory": "20Gi"})
    [pod] = build_worker_pods(resolve_job(job), (0,), attempt=0)
    worker = next(c for c in pod["spec"]["containers"] if c["name"] == "worker")
    limits = worker["resources"]["limits"]
    assert limits == {contract.SHARED_GPU_MEMORY_RESOURCE: 20480}
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in worker["env"]}
    assert env[contract.ENV_GPU_MEMORY_BUDGET] == str(20 * 2**30)


def test_a_shared_worker_is_pinned_by_env_the_kubelet_reads_from_the_placement() -> None:
    """No runtime: the pod itself carries the pin, resolved from the annotation the
    placer's release patch writes before the container can start."""
    job = make_job(workers=1, gpuSharing={"memory": "20Gi"})
    [pod] = build_worker_pods(resolve_job(job), (0,), attempt=0)
    worker = next(c for c in pod["spec"]["containers"] if c["name"] == "worker")
    sources = {e["name"]: e.get("valueFrom") for e in worker["env"]}
    annotation = {"fieldRef": {"fieldPath": "metadata.annotations['trainwave.io/gpu-uuid']"}}
    for name in ("NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", contract.ENV_GPU_UUID):
        assert sources[name] == annotation, name
    assert "initContainers" not in pod["spec"], "pinned without the runtime"


@pytest.mark.parametrize(
    "where",
    [
        {"env": (("CUDA_VISIBLE_DEVICES", "0"),)},
        {"template": {"spec": {"containers": [
            {"name": "worker", "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}
        ]}}},
    ],
    ids=["spec.env", "template"],
)  # fmt: skip
def test_a_shared_worker_may_not_unpin_itself(where: dict[str, Any]) -> None:
    job = make_job(workers=1, gpuSharing={"memory": "20Gi"}, **where)
    with pytest.raises(InvalidSpec, match=r"VISIBLE_DEVICES: with spec.gpuSharing trainwave"):
        resolve_job(job)


ARBITER = "/run/trainwave/arbiter"


@pytest.mark.parametrize(
    ("runtime", "arbiter", "memory_words", "turns"),
    [
        (None, ARBITER, "advertised (TRAINWAVE_GPU_MEMORY_BUDGET_BYTES), not enforced", False),
        ({"enabled": False}, ARBITER, "not enforced", False),
        ({"features": {"submodel": "off"}}, ARBITER, "not enforced", False),
        ({}, None, "when the model's measured peak exceeds it", False),
        ({}, ARBITER, "when the model's measured peak exceeds it", True),
        ({"features": {"submodel": "on"}}, ARBITER, "always trains through", True),
    ],
    ids=["no-runtime", "runtime-disabled", "submodel-off", "auto-no-arbiter", "auto-arbiter",
         "on-arbiter"],
)  # fmt: skip
def test_isolation_says_what_the_pod_is_given_and_nothing_more(
    runtime: Any, arbiter: str | None, memory_words: str, turns: bool
) -> None:
    job = make_job(
        workers=1, gpuSharing={"memory": "20Gi"}, runtime=runtime, command=["python", "t.py"]
    )
    resolved = resolve_job(job, arbiter_dir=arbiter)
    text = isolation(resolved.setup)
    [pod] = build_worker_pods(resolved, (0,), attempt=0)
    worker = next(c for c in pod["spec"]["containers"] if c["name"] == "worker")
    env = {e["name"]: e.get("value") for e in worker["env"]}
    mounted = {m["mountPath"] for m in worker.get("volumeMounts", [])}

    assert text.startswith("soft; GPU: pinned by env (NVIDIA_VISIBLE_DEVICES and CUDA_")
    assert {"NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"} <= set(env)
    assert "no per-GPU device allocation" in text
    assert memory_words in text
    assert "not MIG, not MPS" in text
    # The arbiter is claimed exactly when the worker can reach it.
    assert ("the node's arbiter grants" in text) is turns
    assert ("no arbiter between" in text) is not turns
    assert (ARBITER in mounted) is turns
    if turns:
        assert env[contract.ENV_ARBITER_SOCKET] == f"{ARBITER}/$(TRAINWAVE_GPU_UUID).sock"
    else:
        assert contract.ENV_ARBITER_SOCKET not in env


def test_whole_gpu_jobs_claim_no_isolation() -> None:
    assert isolation(resolve_job(make_job(workers=1)).setup) == ""


# --- placement ---------------------------------------------------------------------------------


def test_jobs_fill_a_used_gpu_before_opening_a_fresh_one() -> None:
    cluster = [node("a", 30720, 0), node("b", 0, 0)]
    [pin] = placed(place_shared(cluster, workers=1, memory_mib=30720))
    assert (pin.node, pin.gpu_uuid) == ("a", "GPU-a-0"), "the half-used GPU, not an empty one"


def test_a_gpu_never_gets_more_than_its_memory() -> None:
    cluster = [node("a", GPU - 1000)]
    refused = place_shared(cluster, workers=1, memory_mib=2000)
    assert isinstance(refused, SharedRefusal)
    assert refused.code == NOT_ENOUGH_GPU_MEMORY
    assert "the most free on any shared GPU is 1000 MiB" in refused.reason


def test_workers_of_one_job_get_distinct_room_and_the_budgets_add_up() -> None:
    cluster = [node("a", 0, 0)]
    pins = placed(place_shared(cluster, workers=4, memory_mib=30720))
    per_gpu: dict[str, int] = {}
    for pin in pins:
        per_gpu[pin.gpu_uuid] = per_gpu.get(pin.gpu_uuid, 0) + pin.memory_mib
    assert sorted(per_gpu.values()) == [61440, 61440]
    assert all(total <= GPU for total in per_gpu.values())


def test_all_or_nothing_with_the_count_that_would_fit() -> None:
    refused = place_shared([node("a", 0)], workers=3, memory_mib=30720)
    assert isinstance(refused, SharedRefusal)
    assert "2 of 3 workers would fit" in refused.reason


@pytest.mark.parametrize(
    ("cluster", "selector", "code"),
    [
        ([], None, NO_SHARED_GPUS),
        ([node("a", 0, labels={"pool": "x"})], {"pool": "y"}, NO_SHARED_GPUS),
        ([node("a", 0)], None, LARGER_THAN_ANY_GPU),
    ],
    ids=["none-offered", "none-matching", "larger-than-any-gpu"],
)
def test_refusals_name_the_reason(cluster: list[SharedNode], selector: Any, code: str) -> None:
    refused = place_shared(cluster, workers=1, memory_mib=GPU + 1, selector=selector)
    assert isinstance(refused, SharedRefusal)
    assert refused.code == code


def test_random_arrivals_never_overfill_a_gpu() -> None:
    import random

    rng = random.Random(7)
    cluster = [node(f"n{i}", 0, 0, 0, 0) for i in range(3)]
    for _ in range(200):
        mib = rng.choice((4096, 10240, 20480, 30720, 40960))
        result = place_shared(cluster, workers=rng.choice((1, 1, 2)), memory_mib=mib)
        if isinstance(result, SharedRefusal):
            continue
        for pin in result:
            cluster = [
                SharedNode(n.name, n.gpu_model, tuple(
                    SharedGpu(g.uuid, g.index, g.memory_mib, g.used_mib + (pin.memory_mib if g.uuid == pin.gpu_uuid else 0))
                    for g in n.gpus
                ), labels=n.labels) if n.name == pin.node else n
                for n in cluster
            ]  # fmt: skip
    assert all(g.used_mib <= g.memory_mib for n in cluster for g in n.gpus)
    assert sum(g.used_mib for n in cluster for g in n.gpus) > 0.8 * 12 * GPU, "it packs"


def test_shared_nodes_from_the_agents_inventory_and_the_pinned_pods() -> None:
    notes = inventory_annotation(
        "n0", gpus=2, product="H100", memory_mib=GPU, nics=0, link_layer=None, rate_gbps=0,
        gpu_direct=False, shared=True,
    )  # fmt: skip
    uuid = json.loads(notes[contract.ANNOTATION_INVENTORY])["sharedGpus"][1]["uuid"]
    raw_node = {"metadata": {"name": "n0", "annotations": notes, "labels": {}}, "status": {}}
    pinned = {
        "metadata": {"annotations": {contract.ANNOTATION_GPU_UUID: uuid}},
        "spec": {
            "nodeName": "n0",
            "containers": [{"resources": {"limits": {contract.SHARED_GPU_MEMORY_RESOURCE: 1000}}}],
        },
        "status": {"phase": "Running"},
    }
    done = {**pinned, "status": {"phase": "Succeeded"}}
    [shared] = build_shared_nodes([raw_node], [pinned, done])
    assert [g.used_mib for g in shared.gpus] == [0, 1000]


# --- memory from a model description -------------------------------------------------------


def test_a_model_description_is_sized_by_the_same_code_as_trainwave_size() -> None:
    # A step light enough that `trainwave size` recommends sharing (its compute bound).
    model = {"preset": "gpt2-124m", "microBatch": 1, "sequence": 128}
    job = make_job(workers=1, gpuSharing={"model": model})
    assert job.spec.gpu_sharing is not None
    memory = shared_memory(job.spec.gpu_sharing)
    setup = TrainingSetup(micro_batch=1, sequence=128)
    expected = recommend(preset("gpt2-124m"), setup, 80 * 2**30)
    assert expected.mode == "shared", expected.reason
    assert memory.bytes == expected.memory_request, "the request `trainwave size` prints"
    assert memory.bytes - estimate_memory(preset("gpt2-124m"), setup).total < 256 * 2**20
    assert memory.how.startswith("estimated from spec.gpuSharing.model (weights ")
    [pod] = build_worker_pods(resolve_job(job), (0,), attempt=0)
    limits = next(c for c in pod["spec"]["containers"] if c["name"] == "worker")["resources"][
        "limits"
    ]
    assert limits[contract.SHARED_GPU_MEMORY_RESOURCE] == memory.mib


@pytest.mark.parametrize(
    "sharing",
    [{}, {"memory": "1Gi", "model": {"preset": "gpt2-124m"}}, {"model": {}}],
    ids=["neither", "both", "model-without-size"],
)
def test_exactly_one_source_of_memory(sharing: dict[str, Any]) -> None:
    with pytest.raises(InvalidSpec, match=r"spec\.gpuSharing"):
        make_job(gpuSharing=sharing)


def test_a_worker_larger_than_any_gpu_fails_the_job_saying_why() -> None:
    job = make_job(
        workers=1,
        phase="Scheduling",
        gpuSharing={"model": {"preset": "llama-7b", "microBatch": 1, "sequence": 2048}},
    )
    gated = [make_pod(0, 0, "Pending", ready=False, bound=False, gated=True)]
    why = PlacementWait(
        LARGER_THAN_ANY_GPU, "asks 120000 MiB of one GPU; the largest shared GPU has 81559 MiB"
    )
    decision = decide(resolve_job(job), gated, NOW, why)
    assert decision.status.phase == Phase.FAILED
    assert decision.status.reason == LARGER_THAN_ANY_GPU
    assert decision.status.message.startswith("spec.gpuSharing: asks 120000 MiB")
