"""RDMA / GPUDirect on the real control plane: rendered pods, node env, and clear refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from integration.node_pools import H100, node_pool
from integration.trainwave_fixtures import apply, job_manifest, wait_for_phase, worker_pods

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "rdma-gpudirect-2x8.yaml"


def worker(pod):
    return next(c for c in pod["spec"]["containers"] if c["name"] == "worker")


def test_the_rdma_example_renders_every_setting_and_node_env(cluster, namespace, running_operator):
    manifest = yaml.safe_load(EXAMPLE.read_text())
    manifest["spec"]["template"]["metadata"]["annotations"]["sim.trainwave.io/run-for"] = "60s"
    apply(cluster, namespace, manifest)
    wait_for_phase(cluster, namespace, manifest["metadata"]["name"], "Running")
    pods = worker_pods(cluster, namespace, manifest["metadata"]["name"])
    assert len(pods) == 2
    for pod in pods:
        container = worker(pod)
        assert container["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]
        assert container["resources"]["limits"]["rdma/rdma_shared_device_a"] == "1"
        shm = next(v for v in pod["spec"]["volumes"] if v["name"] == "trainwave-shm")
        assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "32Gi"}
        assert {"name": "trainwave-shm", "mountPath": "/dev/shm"} in container["volumeMounts"]
        notes = pod["metadata"]["annotations"]
        assert notes["k8s.v1.cni.cncf.io/networks"] == "ib-fabric"
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["NCCL_IB_DISABLE"] == "0"
        # Derived from the inventory of the node this pod was placed on.
        node = json.loads(
            cluster.kubectl("get", "node", pod["spec"]["nodeName"], "-o", "json").stdout
        )
        assert node["metadata"]["labels"]["trainwave.io/gpudirect-rdma"] == "true"
        inventory = json.loads(node["metadata"]["annotations"]["trainwave.io/inventory"])
        ports = [nic["hca"] for nic in inventory["nics"] if nic["state"] == "ACTIVE"]
        assert json.loads(notes["trainwave.io/worker-env"]) == {
            "NCCL_IB_HCA": "=" + ",".join(ports),
            "NCCL_NET_GDR_LEVEL": "PIX",
            # 8 ports x 400 Gbit/s on every simulated IB node: the runtime's `auto` reads it.
            "TRAINWAVE_INTER_NODE_GBPS": "3200",
        }


@pytest.mark.parametrize(
    "case",
    [
        ({"cpu": "192", "gpu": H100}, {}, "has active RDMA ports"),
        (
            {
                "cpu": "192",
                "gpu": H100,
                "rdma": {"nics": 4, "linkLayer": "IB", "rateGbps": 200, "gpuDirect": False},
            },
            {"gpuDirect": "Required"},
            "none has working GPUDirect RDMA",
        ),
    ],
    ids=["no-rdma-at-all", "rdma-without-gpudirect"],
)
def test_rdma_the_nodes_cannot_give_fails_the_job_with_the_reason(
    cluster, namespace, running_operator, case
):
    shape, rdma, words = case
    with node_pool(cluster, rack_sizes=(2,), shape=shape) as pool:
        manifest = job_manifest(
            "wants-rdma", workers=2, gpus=8, template_spec={"nodeSelector": pool.selector},
            network={"rdma": rdma},
        )  # fmt: skip
        apply(cluster, namespace, manifest)
        body = wait_for_phase(cluster, namespace, "wants-rdma", "Failed", timeout=30)
        assert body["status"]["reason"] == "RDMAUnavailable"
        message = body["status"]["message"]
        assert message.startswith("spec.network.rdma: asks for RDMA"), message
        assert words in message
        assert "2 node(s) the job may use" in message
        assert not worker_pods(cluster, namespace, "wants-rdma") or all(
            p["metadata"].get("deletionTimestamp") or not p["spec"].get("nodeName")
            for p in worker_pods(cluster, namespace, "wants-rdma")
        ), "no worker was ever bound"
