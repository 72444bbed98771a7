"""Shared GPUs accounted per GPU by Kubernetes (DRA) on the real control plane.

The pool's shared GPUs are published as ResourceSlices by the agent's own code
(`node_pool(gpu_slices=True)`), the chart installs the DeviceClass and the RBAC
(`agent.gpuClaims=true`), and the operator runs with `--gpu-claims`: each shared
worker's ResourceClaim is created at release for the GPU the packer chose, and
kube-scheduler allocates it (control plane built with DRAConsumableCapacity on).
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import config

from cluster.controlplane import Cluster, tool
from cluster.deploy import OperatorProcess, install_chart
from integration import test_agent_publishes as agent_tests
from integration.node_pools import H100, node_pool
from integration.test_agent_publishes import (
    TEST_TAINT,
    agent_argv,
    agent_env,
    create_node,
    run_agent,
    write_inputs,
)
from integration.trainwave_fixtures import (
    apply,
    condition,
    get_json,
    job,
    job_manifest,
    wait_for_phase,
    wait_until,
    worker_pods,
)
from trainwave.agent.changes import quantity_value
from trainwave.agent.slices import NodeRef, build_slices
from trainwave.controller.clusterview import listed_view
from trainwave.controller.kube import KubeClient
from trainwave.hardware.inventory import GpuInfo

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

SHARED_NODE = {"cpu": "192", "gpu": {**H100, "count": 2, "shared": True}}
MIB = 30 * 1024  # two fit on one 80GB GPU (81559 MiB), three do not
DRIVER = "gpu.trainwave.io"


# The agent tests' fixtures: a fresh node name, and the agent's token bound to a pod there.
node_name = agent_tests.node_name
bound_kubeconfig = agent_tests.bound_kubeconfig


@pytest.fixture(scope="module")
def claims_chart(operator: OperatorProcess, trainwave_installed: Cluster) -> Iterator[Cluster]:
    """The chart with agent.gpuClaims: the DeviceClass and the RBAC for slices and claims."""
    operator.stop()
    install_chart(trainwave_installed, "--set", "agent.gpuClaims=true")
    yield trainwave_installed
    install_chart(trainwave_installed)
    operator.start()


@pytest.fixture(scope="module")
def claims_operator(
    operator: OperatorProcess, claims_chart: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    log = tmp_path_factory.mktemp("claims-operator") / "operator.log"
    mine = OperatorProcess(
        kubeconfig=operator.kubeconfig, log_path=log, extra_args=("--gpu-claims",)
    )
    mine.start()
    yield mine
    mine.stop()


def test_the_agent_publishes_its_shared_gpus_as_slices_and_keeps_them_current(
    claims_chart: Cluster, bound_kubeconfig: Path, node_name: str, tmp_path: Path
) -> None:
    cluster = claims_chart
    create_node(cluster, node_name)
    root, gpus = write_inputs(tmp_path / "inputs")
    args = ("--shared-gpus", "0,1", "--gpu-slices")

    first = run_agent(bound_kubeconfig, node_name, root, gpus, *args)
    assert first.returncode == 0, first.stderr
    assert f"change=resourceslice-added key={node_name}-gpu-0 new='generation 1'" in first.stderr
    devices = slices_of(cluster, node_name)
    assert sorted(devices) == ["gpu-0", "gpu-1"]
    assert all(d["allowMultipleAllocations"] for d in devices.values())
    uid = cluster.kubectl("get", "node", node_name, "-o", "jsonpath={.metadata.uid}").stdout
    owners = {
        o["uid"]
        for item in slice_items(cluster, node_name)
        for o in item["metadata"]["ownerReferences"]
    }
    assert owners == {uid.strip()}, "owned by the Node: deleted with it"

    again = run_agent(bound_kubeconfig, node_name, root, gpus, *args)
    assert again.returncode == 0, again.stderr
    assert "change=resourceslice" not in again.stderr, "nothing changed, nothing sent"

    # The token is bound to a pod on node_name: no slice of another node (admission policy).
    other = build_slices(
        NodeRef("someone-elses-node", "uid-0"),
        (GpuInfo(0, "GPU-x", "H100", 81559, "0000:18:00.0", 0),),
        generation=1,
    )[0]
    refused = subprocess.run(
        [str(tool("kubectl")), "--kubeconfig", str(bound_kubeconfig), "create", "-f", "-"],
        input=json.dumps(other), capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert refused.returncode != 0
    assert "may write only the ResourceSlices of the Node its pod runs on" in refused.stderr
    assert f"bound to a pod on {node_name}, the slice is on someone-elses-node" in refused.stderr

    fewer = run_agent(bound_kubeconfig, node_name, root, gpus, "--shared-gpus", "1", "--gpu-slices")
    assert fewer.returncode == 0, fewer.stderr
    [item] = slice_items(cluster, node_name)
    assert item["metadata"]["name"] == f"{node_name}-gpu-1"
    assert item["spec"]["pool"] == {"name": node_name, "generation": 2, "resourceSliceCount": 1}


def shared_job(name: str, pool: Any, memory: str = "30Gi") -> dict[str, Any]:
    manifest = job_manifest(
        name, workers=1, gpus=0, run_for="300s", template_spec={"nodeSelector": pool.selector}
    )
    manifest["spec"]["gpuSharing"] = {"memory": memory}
    return manifest


def claim_of(cluster: Cluster, namespace: str, pod: dict[str, Any]) -> dict[str, Any]:
    [reference] = pod["spec"]["resourceClaims"]
    return get_json(cluster, namespace, "resourceclaim", reference["resourceClaimName"])  # type: ignore[no-any-return]


def test_the_agent_prepares_an_allocated_claim_for_the_kubelet(
    claims_chart: Cluster, bound_kubeconfig: Path, node_name: str, namespace: str, tmp_path: Path
) -> None:
    """The kubelet side, on its real gRPC protocol: draclient is built from the kubelet's own
    generated clients (tests/cluster/k8s-build/draclient) and asks the running agent what
    the kubelet asks; the claim is one kube-scheduler allocated on this node's slices."""
    cluster = claims_chart
    create_node(cluster, node_name)
    root, gpus = write_inputs(tmp_path / "inputs")
    args = ("--shared-gpus", "0,1", "--gpu-slices")
    assert run_agent(bound_kubeconfig, node_name, root, gpus, *args).returncode == 0
    devices = slices_of(cluster, node_name)
    uuid = devices["gpu-1"]["attributes"]["uuid"]["string"]
    claim, pod = foreign_claim_pod("on-agent-node", None, uuid, 10 * 1024)
    pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node_name}
    pod["spec"]["tolerations"] = [{**TEST_TAINT, "operator": "Exists"}]
    apply(cluster, namespace, claim, pod)
    wait_until(
        lambda: get_json(cluster, namespace, "pod", "on-agent-node")["spec"].get("nodeName"),
        60, "kube-scheduler to allocate the claim and bind the pod",
    )  # fmt: skip
    stored = get_json(cluster, namespace, "resourceclaim", "on-agent-node")
    uid = stored["metadata"]["uid"]

    # Short paths: a unix socket's path must fit in 108 bytes.
    short = Path(tempfile.mkdtemp(prefix="kp-", dir="/tmp"))
    kubelet, cdi = short / "kubelet", short / "cdi"
    agent = subprocess.Popen(
        agent_argv(node_name, root, gpus, *args, "--kubelet-plugin", "--kubelet-dir",
                   str(kubelet), "--cdi-dir", str(cdi), "--interval", "60"),
        env=agent_env(bound_kubeconfig), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    registration = kubelet / "plugins_registry" / f"{DRIVER}-reg.sock"
    try:
        wait_until(lambda: registration.exists() and (cdi / "trainwave.io-gpu.json").exists(),
                   30, "the agent's plugin sockets and CDI spec")  # fmt: skip

        def ask(claim_uid: str) -> dict[str, Any]:
            found = subprocess.run(
                [str(tool("draclient")), "-registration", str(registration), "-namespace",
                 namespace, "-name", "on-agent-node", "-uid", claim_uid],
                capture_output=True, text=True, timeout=60, check=True,
            )  # fmt: skip
            answer: dict[str, Any] = json.loads(found.stdout)
            return answer

        answer = ask(uid)
        assert answer["info"] == {
            "type": "DRAPlugin",
            "name": DRIVER,
            "endpoint": str(kubelet / "plugins" / DRIVER / "dra.sock"),
            "supported_versions": ["v1.DRAPlugin"],
        }
        assert answer["prepared"]["claims"][uid] == {
            "devices": [
                {
                    "request_names": ["gpu"],
                    "pool_name": node_name,
                    "device_name": "gpu-1",
                    "cdi_device_ids": ["trainwave.io/gpu=gpu-1"],
                }
            ]
        }
        assert answer["unprepared"]["claims"] == {uid: {}}
        wrong = ask("not-the-uid")["prepared"]["claims"]["not-the-uid"]
        assert f"has UID {uid}, the kubelet asked for not-the-uid" in wrong["error"]

        spec = json.loads((cdi / "trainwave.io-gpu.json").read_text())
        assert spec["kind"] == "trainwave.io/gpu"
        edits = {d["name"]: d["containerEdits"]["env"] for d in spec["devices"]}
        assert edits["gpu-1"] == [f"NVIDIA_VISIBLE_DEVICES={uuid}"]
    except AssertionError as failed:
        agent.send_signal(signal.SIGTERM)
        output, _ = agent.communicate(timeout=90)
        raise AssertionError(f"{failed}\nthe agent said:\n{output}") from None
    agent.send_signal(signal.SIGTERM)
    output, _ = agent.communicate(timeout=90)
    assert agent.returncode == 0, output
    assert not registration.exists(), "the sockets go with the agent"
    shutil.rmtree(short, ignore_errors=True)


def test_the_agent_publishes_again_when_the_kubelet_deletes_its_slices(
    claims_chart: Cluster, bound_kubeconfig: Path, node_name: str, tmp_path: Path
) -> None:
    """A kubelet that starts deletes every ResourceSlice of its node (seen on the real
    node: the slices stayed away until the agent's next pass). The agent watches its
    slices and publishes again at once, long before its hour-long interval."""
    cluster = claims_chart
    create_node(cluster, node_name)
    root, gpus = write_inputs(tmp_path / "inputs")
    agent = subprocess.Popen(
        agent_argv(node_name, root, gpus, "--shared-gpus", "0,1", "--gpu-slices",
                   "--interval", "3600"),
        env=agent_env(bound_kubeconfig), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    try:
        wait_until(lambda: sorted(slices_of(cluster, node_name)) == ["gpu-0", "gpu-1"], 60,
                   "the agent's slices")  # fmt: skip
        time.sleep(1)  # the watch starts before the first pass; a second to be established
        # What the kubelet's DRA manager does when it starts.
        cluster.kubectl(
            "delete", "resourceslices", "--field-selector", f"spec.nodeName={node_name}"
        )
        wait_until(lambda: sorted(slices_of(cluster, node_name)) == ["gpu-0", "gpu-1"], 30,
                   "the slices published again")  # fmt: skip
    finally:
        agent.send_signal(signal.SIGTERM)
        output, _ = agent.communicate(timeout=90)
    assert agent.returncode == 0, output
    assert f"ResourceSlice {node_name}-gpu-0 deleted: publishing again" in output, output


def slice_items(cluster: Cluster, node: str) -> list[dict[str, Any]]:
    """The node's ResourceSlices of our driver."""
    listing = json.loads(
        cluster.kubectl(
            "get", "resourceslices", "--field-selector", f"spec.nodeName={node}", "-o", "json"
        ).stdout
    )
    return [item for item in listing["items"] if item["spec"]["driver"] == DRIVER]


def slices_of(cluster: Cluster, node: str) -> dict[str, dict[str, Any]]:
    """device name -> its device, for the node's slices of our driver."""
    return {
        device["name"]: device
        for item in slice_items(cluster, node)
        for device in item["spec"]["devices"]
    }


def test_each_shared_worker_gets_a_claim_allocated_on_its_pinned_gpu(
    cluster: Cluster, namespace: str, claims_operator: OperatorProcess
) -> None:
    with node_pool(cluster, rack_sizes=(1,), shape=SHARED_NODE, gpu_slices=True) as pool:
        [node] = pool.nodes
        devices = slices_of(cluster, node)
        assert sorted(devices) == ["gpu-0", "gpu-1"]
        assert all(d["allowMultipleAllocations"] for d in devices.values()), "gate is on"
        by_uuid = {d["attributes"]["uuid"]["string"]: name for name, d in devices.items()}

        names = [f"claimed-{i}" for i in range(4)]
        apply(cluster, namespace, *(shared_job(n, pool) for n in names))
        for name in names:
            wait_for_phase(cluster, namespace, name, "Running", timeout=90)
        used: dict[str, int] = {}
        for name in names:
            [pod] = worker_pods(cluster, namespace, name)
            worker = next(c for c in pod["spec"]["containers"] if c["name"] == "worker")
            assert worker["resources"]["claims"] == [{"name": "shared-gpu"}]
            claim = claim_of(cluster, namespace, pod)
            assert claim["metadata"]["ownerReferences"][0]["uid"] == pod["metadata"]["uid"]
            [result] = claim["status"]["allocation"]["devices"]["results"]
            uuid = pod["metadata"]["annotations"]["trainwave.io/gpu-uuid"]
            assert (result["driver"], result["pool"]) == (DRIVER, node)
            assert result["device"] == by_uuid[uuid], "allocated on the GPU the packer chose"
            assert result["shareID"], "a share of the device, not the whole device"
            assert quantity_value(result["consumedCapacity"]["memory"]) == MIB * 2**20
            reserved = [r["name"] for r in claim["status"].get("reservedFor", [])]
            assert reserved == [pod["metadata"]["name"]]
            used[result["device"]] = used.get(result["device"], 0) + MIB
        assert used == {"gpu-0": 2 * MIB, "gpu-1": 2 * MIB}
        isolation = job(cluster, namespace, names[0])["status"]["isolation"]
        assert "a DRA ResourceClaim takes" in isolation


def test_shared_workers_filling_gpus_at_once_are_all_bound_without_a_refusal(
    cluster: Cluster, namespace: str, claims_operator: OperatorProcess
) -> None:
    """Sixteen one-worker jobs that fill eight GPUs two by two, applied at once. While
    kube-scheduler binds a pod, the memory its claim consumes is counted twice for a moment
    (v1.34.4, dynamicresources/dra_manager.go GatherAllocatedState: the claim is already in
    the assume cache's allocated devices and still in the in-flight allocations until
    PreBind ends); a claim for the same GPU scheduled in that moment is refused, and nothing
    but the first claim's deallocation asks again. The operator therefore releases a shared
    GPU's next worker once the one before is bound (controller/releasing.py)."""
    shape = {"cpu": "192", "gpu": {**H100, "count": 8, "shared": True}}
    with node_pool(cluster, rack_sizes=(1,), shape=shape, gpu_slices=True) as pool:
        [node] = pool.nodes
        names = [f"fill-{i}" for i in range(16)]
        apply(cluster, namespace, *(shared_job(n, pool, "39Gi") for n in names))
        for name in names:
            wait_for_phase(cluster, namespace, name, "Running", timeout=120)
        refusals = [
            event["message"]
            for event in get_json(cluster, namespace, "events")["items"]
            if event.get("reason") == "FailedScheduling"
        ]
        assert refusals == [], refusals
        pinned: dict[str, int] = {}
        for name in names:
            [pod] = worker_pods(cluster, namespace, name)
            assert pod["spec"]["nodeName"] == node
            uuid = pod["metadata"]["annotations"]["trainwave.io/gpu-uuid"]
            pinned[uuid] = pinned.get(uuid, 0) + 1
        assert sorted(pinned.values()) == [2] * 8, pinned


def foreign_claim_pod(name: str, pool: Any, uuid: str, mib: int) -> list[dict[str, Any]]:
    """A pod trainwave does not know, whose claim kube-scheduler allocates on GPU `uuid`.
    `pool`: where the pod may go (its nodeSelector); None leaves that to the caller."""
    selector = f'device.attributes["{DRIVER}"].uuid == "{uuid}"'
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "shared-gpu.trainwave.io",
            "selectors": [{"cel": {"expression": selector}}],
            "capacity": {"requests": {"memory": f"{mib}Mi"}},
        }}]}},
    }  # fmt: skip
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": {"sim.trainwave.io/run-for": "600s"}},
        "spec": {
            "nodeSelector": pool.selector if pool is not None else {},
            "resourceClaims": [{"name": "g", "resourceClaimName": name}],
            "containers": [{"name": "c", "image": "busybox", "resources": {"claims": [{"name": "g"}]}}],
        },
    }  # fmt: skip
    return [claim, pod]


def test_memory_held_by_other_claims_is_counted_by_the_packer_and_kube_scheduler(
    cluster: Cluster, namespace: str, claims_operator: OperatorProcess
) -> None:
    """Claims trainwave did not make (pods that are not its workers) hold GPU memory too: the
    packer counts them from its claim watch, so the worker waits behind its gate naming the
    GPU, and kube-scheduler refuses any claim that would over-commit a GPU. Once the memory
    is freed the worker is placed."""
    with node_pool(cluster, rack_sizes=(1,), shape=SHARED_NODE, gpu_slices=True) as pool:
        [node] = pool.nodes
        devices = slices_of(cluster, node)
        uuids = [d["attributes"]["uuid"]["string"] for d in devices.values()]
        hogs = [f"hog-{i}" for i in range(len(uuids))]
        for hog, uuid in zip(hogs, uuids, strict=True):
            apply(cluster, namespace, *foreign_claim_pod(hog, pool, uuid, 60 * 1024))
        for hog in hogs:
            wait_until(
                lambda hog=hog: get_json(cluster, namespace, "pod", hog)["spec"].get("nodeName"),
                60, f"{hog} to be bound with its claim",
            )  # fmt: skip

        # `trainwave plan`'s fresh listing counts them as the placer's watch does.
        kube = KubeClient(config.new_client_from_config(str(cluster.kubeconfig)))
        listed = listed_view(kube).usage[node].gpu_mib
        assert listed == dict.fromkeys(uuids, 60 * 1024)

        apply(cluster, namespace, shared_job("squeezed", pool))
        why = wait_until(
            lambda: (c := condition(job(cluster, namespace, "squeezed"), "Scheduled"))
            and c["reason"] == "NotEnoughGPUMemory" and c,
            60, "the worker to wait for GPU memory",
        )  # fmt: skip
        assert "needs 30720 MiB on one GPU per worker" in why["message"]
        [pod] = worker_pods(cluster, namespace, "squeezed")
        assert pod["spec"]["schedulingGates"], "it waits behind the gate: no claim made"

        # kube-scheduler's own check, for a claim nobody pre-checked.
        apply(cluster, namespace, *foreign_claim_pod("late", pool, uuids[0], 30 * 1024))
        refusal = wait_until(
            lambda: next(
                (
                    c
                    for c in get_json(cluster, namespace, "pod", "late")["status"].get(
                        "conditions", []
                    )
                    if c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable"
                ),
                None,
            ),
            60, "kube-scheduler to refuse the over-committing claim",
        )  # fmt: skip
        assert "cannot allocate all claims" in refusal["message"], refusal

        cluster.kubectl("delete", "pod", *hogs, "-n", namespace, "--wait=true")
        wait_for_phase(cluster, namespace, "squeezed", "Running", timeout=120)
