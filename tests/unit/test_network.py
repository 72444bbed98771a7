"""The `network` block: pod settings, node requirements, NCCL env from a node's inventory."""

from __future__ import annotations

import json
from typing import Any

import pytest
from factories import make_job
from placement_factories import make_node

from cluster.inventory import ROCE_V2_GID_INDEX, inventory_annotation
from trainwave import contract
from trainwave.api.trainingjob import InvalidSpec, parse_trainingjob
from trainwave.builders.network import (
    gang_link_env,
    network_requirements,
    node_network_env,
    rdma_shortfall,
)
from trainwave.builders.pods import build_worker_pods
from trainwave.hardware.inventory import NodeInventory, from_document
from trainwave.placement.snapshot import ClusterSnapshot
from trainwave.placement.topology import DEFAULT_LEVELS
from trainwave.resolving import gang_request, resolve_job

pytestmark = pytest.mark.timeout(10)

RDMA = {"rdma": {}, "networks": ["fabric/ib0"], "socketInterface": "eth0"}


def worker(network: dict[str, Any] | None, **options: Any) -> dict[str, Any]:
    job = make_job(workers=1, gpus_per_worker=8, network=network, **options)
    [pod] = build_worker_pods(resolve_job(job), (0,), attempt=0)
    return pod


def container(pod: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in pod["spec"]["containers"] if c["name"] == contract.WORKER_CONTAINER)


def env(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container(pod).get("env", [])}


def annotation_document(
    link_layer: str | None = "IB", *, gpu_direct: bool = True, nics: int = 8
) -> dict[str, Any]:
    text = inventory_annotation(
        "n", gpus=8, product="H100", memory_mib=81559, nics=nics, link_layer=link_layer,
        rate_gbps=400, gpu_direct=gpu_direct,
    )[contract.ANNOTATION_INVENTORY]  # fmt: skip
    document: dict[str, Any] = json.loads(text)
    return document


def inventory(
    link_layer: str | None = "IB", *, gpu_direct: bool = True, nics: int = 8
) -> NodeInventory:
    """A simulated node's annotation, read back as the placer reads it."""
    return from_document(annotation_document(link_layer, gpu_direct=gpu_direct, nics=nics))


def network(**rdma: Any) -> Any:
    job = make_job(network={"rdma": rdma})
    return job.spec.network


# --- the pod -------------------------------------------------------------------------------------


def test_an_rdma_worker_gets_ipc_lock_the_resource_shm_networks_and_nccl_env() -> None:
    pod = worker(RDMA)
    worker_container = container(pod)
    assert worker_container["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]
    assert worker_container["resources"]["limits"][contract.RDMA_RESOURCE] == 1
    assert worker_container["resources"]["limits"][contract.GPU_RESOURCE] == 8
    assert {"name": "trainwave-shm", "mountPath": "/dev/shm"} in worker_container["volumeMounts"]
    [volume] = [v for v in pod["spec"]["volumes"] if v["name"] == "trainwave-shm"]
    assert volume["emptyDir"] == {"medium": "Memory", "sizeLimit": "16Gi"}
    assert pod["metadata"]["annotations"][contract.ANNOTATION_MULTUS_NETWORKS] == "fabric/ib0"
    assert {
        "NCCL_IB_DISABLE": "0", "NCCL_SOCKET_IFNAME": "eth0", "NCCL_DEBUG": "INFO",
        "NCCL_DEBUG_SUBSYS": "INIT,NET",
    }.items() <= env(pod).items()  # fmt: skip
    assert "hostNetwork" not in pod["spec"]


def test_a_job_without_a_network_block_gets_none_of_it() -> None:
    pod = worker(None)
    assert "securityContext" not in container(pod)
    assert not any(k.startswith("NCCL_") for k in env(pod))
    assert contract.ANNOTATION_MULTUS_NETWORKS not in pod["metadata"]["annotations"]


def test_host_network_uses_the_cluster_dns_and_user_capabilities_are_kept() -> None:
    template = {
        "spec": {
            "containers": [
                {"name": "worker", "securityContext": {"capabilities": {"add": ["SYS_PTRACE"]}}}
            ]
        }
    }
    pod = worker(
        {"hostNetwork": True, "rdma": {"count": 2, "resourceName": "rdma/hca"}, "shmSize": None},
        template=template,
    )
    assert pod["spec"]["hostNetwork"] is True
    assert pod["spec"]["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert container(pod)["securityContext"]["capabilities"]["add"] == ["SYS_PTRACE", "IPC_LOCK"]
    assert container(pod)["resources"]["limits"]["rdma/hca"] == 2
    assert "volumes" not in pod["spec"]


def test_gpudirect_disabled_is_pinned_in_the_pod() -> None:
    assert env(worker({"rdma": {"gpuDirect": "Disabled"}}))["NCCL_NET_GDR_LEVEL"] == "LOC"


@pytest.mark.parametrize(
    ("value", "accepted"),
    [
        ({"rdma": {"linkLayer": "Ethernet"}}, "InfiniBand"),
        ({"networks": ["Bad_Name"]}, "pattern"),
        ({"rdma": {"count": 0}}, "greater than or equal to 1"),
    ],
    ids=["link-layer", "network-name", "count"],
)
def test_bad_network_fields_are_refused_naming_them(value: dict[str, Any], accepted: str) -> None:
    body = make_job().model_dump(by_alias=True, mode="json")
    body["spec"]["network"] = value
    with pytest.raises(InvalidSpec, match=r"spec\.network") as error:
        parse_trainingjob({**body, "metadata": {"name": "x", "namespace": "n", "uid": "u"}})
    assert accepted in str(error.value)


# --- where the gang may go -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rdma", "expected"),
    [
        ({}, {contract.NODE_LABEL_RDMA: frozenset({"infiniband", "roce"})}),
        ({"linkLayer": "RoCE"}, {contract.NODE_LABEL_RDMA: "roce"}),
        ({"linkLayer": "InfiniBand", "gpuDirect": "Required"},
         {contract.NODE_LABEL_RDMA: "infiniband", contract.NODE_LABEL_GPUDIRECT: "true"}),
    ],
    ids=["any", "roce", "ib-gdr-required"],
)  # fmt: skip
def test_network_requirements(rdma: dict[str, Any], expected: dict[str, Any]) -> None:
    assert network_requirements(network(**rdma)) == expected


def test_the_gang_request_carries_the_requirements_beside_the_users_selector() -> None:
    job = make_job(
        network={"rdma": {"linkLayer": "RoCE"}}, template={"spec": {"nodeSelector": {"pool": "a"}}}
    )
    assert gang_request(job, DEFAULT_LEVELS).node_selector == {
        "pool": "a",
        contract.NODE_LABEL_RDMA: "roce",
    }


def snapshot(*labels: dict[str, str]) -> ClusterSnapshot:
    return ClusterSnapshot.of([make_node(f"n{i}", labels=lab) for i, lab in enumerate(labels)])


IB = {contract.NODE_LABEL_RDMA: "infiniband", contract.NODE_LABEL_GPUDIRECT: "false"}


@pytest.mark.parametrize(
    ("rdma", "nodes", "words"),
    [
        ({}, ({}, {}), "none of the 2 node(s) the job may use has active RDMA ports"),
        ({"linkLayer": "RoCE"}, (IB, {}), "none of the 2 node(s)"),
        ({"gpuDirect": "Required"}, (IB, IB, {}), "2 of the 3 node(s) the job may use have RDMA but none has working GPUDirect"),
    ],
    ids=["no-rdma", "wrong-link-layer", "no-gpudirect"],
)  # fmt: skip
def test_rdma_shortfall_explains_what_the_cluster_lacks(
    rdma: dict[str, Any], nodes: tuple[dict[str, str], ...], words: str
) -> None:
    spec = network(**rdma)
    reason = rdma_shortfall(spec, network_requirements(spec), snapshot(*nodes))
    assert reason is not None
    assert words in reason


def test_no_shortfall_when_one_node_qualifies_even_if_busy() -> None:
    spec = network(gpuDirect="Required")
    busy = {**IB, contract.NODE_LABEL_GPUDIRECT: "true"}
    cluster = ClusterSnapshot.of([make_node("n0", labels=busy, free=0), make_node("n1")])
    assert rdma_shortfall(spec, network_requirements(spec), cluster) is None


# --- NCCL settings for the chosen node ---------------------------------------------------------


def test_ib_node_lists_its_ports_exactly_nearest_gpu_first() -> None:
    found = node_network_env(network(), inventory("IB"))
    assert found == {
        "NCCL_IB_HCA": "=" + ",".join(f"mlx5_{i}:1" for i in range(8)),
        "NCCL_NET_GDR_LEVEL": "PIX",
    }


def test_down_ports_and_the_other_link_layer_are_left_out() -> None:
    document = annotation_document("IB", nics=3)
    document["nics"][1]["state"] = "DOWN"
    document["nics"].append({**document["nics"][0], "hca": "mlx5_9:1", "linkLayer": "RoCE"})
    assert (
        node_network_env(network(linkLayer="InfiniBand"), from_document(document))["NCCL_IB_HCA"]
        == "=mlx5_0:1,mlx5_2:1"
    )


def test_roce_gets_the_v2_gid_index() -> None:
    found = node_network_env(network(linkLayer="RoCE"), inventory("RoCE"))
    assert found["NCCL_IB_GID_INDEX"] == str(ROCE_V2_GID_INDEX)


def test_no_peer_memory_pins_gdr_off_instead_of_failing_later() -> None:
    assert (
        node_network_env(network(), inventory("IB", gpu_direct=False))["NCCL_NET_GDR_LEVEL"]
        == "LOC"
    )


@pytest.mark.parametrize(
    ("distances", "level"),
    [(("PIX", "PXB"), "PXB"), (("PIX", "SYS"), "PHB"), (("NODE",), "PHB")],
    ids=["worst-within-switches", "across-sockets-capped", "node-capped"],
)
def test_gdr_level_follows_the_worst_nearest_path_capped_at_the_host_bridge(
    distances: tuple[str, ...], level: str
) -> None:
    document = annotation_document("IB", nics=2)
    document["nearestNic"] = {
        str(i): {"hca": f"mlx5_{i % 2}:1", "distance": d, "gdrInReach": False}
        for i, d in enumerate(distances)
    }
    assert node_network_env(network(), from_document(document))["NCCL_NET_GDR_LEVEL"] == level


def test_a_node_without_an_inventory_or_rdma_gets_no_node_env() -> None:
    assert node_network_env(network(), None) == {}
    assert node_network_env(network(), inventory(None)) == {}
    assert node_network_env(None, inventory("IB")) == {}


def test_the_users_nccl_settings_win_over_the_defaults() -> None:
    pod = worker({"rdma": {}}, env=(("NCCL_DEBUG", "WARN"),))
    values = [e["value"] for e in container(pod)["env"] if e["name"] == "NCCL_DEBUG"]
    assert values == ["WARN"]


def test_the_gang_link_rate_is_its_slowest_nodes_active_ports() -> None:
    document = annotation_document("IB", nics=2)
    document["nics"][1]["state"] = "DOWN"
    fast, slow = inventory("IB"), from_document(document)
    assert gang_link_env(network(), [fast, slow]) == {contract.ENV_INTER_NODE_GBPS: "400"}
    assert gang_link_env(network(), [fast, inventory(None)]) == {}, "a node without: unknown"
    assert gang_link_env(None, [fast]) == {}, "no RDMA asked: TCP's rate is not known"
