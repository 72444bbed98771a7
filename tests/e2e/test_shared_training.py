"""End to end on the real node: two TrainingJobs share one fake GPU through DRA.

The chart runs as installed by the e2e conftest (`release`: the operator and the agent as
pods on the real node, `agent.gpuClaims` on, the arbiter as the agent pod's second
container). This module upgrades the release for its own duration so the agent reads a
fake-GPU file with ONE GPU of 5 MiB, offered for sharing, and restores the values after.
There is no GPU on this machine: the fake file stands in for NVML, and the jobs train on
the runtime's CPU-simulated device tier, so every memory peak here is model-based.

What runs for real: the agent publishes the GPU as a ResourceSlice and serves its DRA
kubelet plugin, which the real kubelet finds through /var/lib/kubelet/plugins_registry;
the operator gives each shared worker a ResourceClaim for the GPU its packer chose;
kube-scheduler allocates it; the kubelet calls the agent's NodePrepareResources and
passes the answered CDI device (`trainwave.io/gpu=gpu-0`) to containerd v2, which applies
the agent's CDI spec (/var/run/cdi, a directory containerd reads by default) to the
container. Each job's model needs about 3.7 MB to train plainly and gets a 2 MiB budget:
prepare() measures that and trains through the submodel allocator, taking turns on the
GPU's memory through the arbiter's socket. A third job would overfill the GPU and waits,
naming the GPU.

The operator's pod spec also sets NVIDIA_VISIBLE_DEVICES (from the placement annotation),
so a worker's environment alone cannot tell the two routes apart: the CDI route is shown
by a pod with only a claim and no such env, and by the CDI device containerd recorded
for each worker container (`crictl inspect`).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from cluster.controlplane import Cluster
from cluster.deploy import NAMESPACE
from cluster.realnode_restart import restart_kubelet
from e2e.conftest import ON_REAL_NODE, WORKER_IMAGE, Release
from e2e.test_training import SCRIPTS, SITE_PACKAGES, events, pod_logs, read_only_host_path
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
from trainwave import contract
from trainwave.runtime.submodel.arbiter import ArbiterClient

GPU_MIB = 5
BUDGET = 2 << 20  # 2Mi: about half of what the model needs to train plainly
GPU_UUID = "GPU-e2e5a4ed-0000-4000-8000-000000000000"
ONE_SHARED_GPU = {
    "gpus": [{"uuid": GPU_UUID, "name": "Simulated-CPU-Device", "memoryMiB": GPU_MIB,
              "pciBusId": "00000000:01:00.0"}],
}  # fmt: skip
DEVICE = f"{contract.DRA_DEVICE_PREFIX}0"
CDI_ID = f"{contract.CDI_KIND}={DEVICE}"
CDI_SPEC = "/var/run/cdi/trainwave.io-gpu.json"  # where the chart's agent writes it
REGISTRATION = f"/var/lib/kubelet/plugins_registry/{contract.DRA_DRIVER}-reg.sock"


def agent_log(release: Release) -> str:
    pod = release.agent_pod()["metadata"]["name"]
    return pod_logs(release.cluster, NAMESPACE, pod, "agent")


def try_agent_log(release: Release) -> str:
    """The agent's log, or "" while the kubelet cannot serve it (just restarted)."""
    try:
        return agent_log(release)
    except subprocess.CalledProcessError:
        return ""


@pytest.fixture(scope="module")
def shared_gpu(release: Release) -> Iterator[str]:
    """The release upgraded to one fake GPU of 5 MiB, shared, until the module ends; yields
    its UUID once the kubelet registered the agent's plugin, the GPU's slice is published,
    the CDI spec names it and the arbiter serves its socket."""
    gpus = release.cluster.state_dir / "e2e" / "one-shared-gpu.json"
    gpus.write_text(json.dumps(ONE_SHARED_GPU))
    agent = {**release.values["agent"], "fakeGpus": str(gpus), "sharedGpus": "0"}
    release.upgrade({**release.values, "agent": agent}, "values-one-shared-gpu.yaml")
    try:
        wait_until(lambda: "registered with the kubelet" in agent_log(release), 60,
                   "the kubelet to register the agent's DRA plugin")  # fmt: skip
        wait_until(lambda: slice_devices(release.cluster, release.node).get(DEVICE), 60,
                   "the GPU's ResourceSlice")  # fmt: skip
        wait_until(lambda: GPU_UUID in read_host(CDI_SPEC), 60, "the agent's CDI spec")
        wait_until(lambda: arbiter_socket().startswith("/") and host_has(arbiter_socket()),
                   60, "the arbiter's socket for the GPU")  # fmt: skip
        yield GPU_UUID
    finally:
        release.upgrade(release.values, "values-restored.yaml")


def arbiter_socket() -> str:
    return f"/run/trainwave/arbiter/{GPU_UUID}.sock"  # agent.arbiter.hostPath, the default


def host_has(path: str) -> bool:
    return os.path.exists(path)


def read_host(path: str) -> str:
    try:
        with open(path) as file:
            return file.read()
    except OSError:
        return ""


def slice_items(cluster: Cluster, node: str) -> list[dict[str, Any]]:
    listing = json.loads(cluster.kubectl("get", "resourceslices", "--field-selector",
                                         f"spec.nodeName={node}", "-o", "json").stdout)  # fmt: skip
    return [item for item in listing["items"] if item["spec"]["driver"] == contract.DRA_DRIVER]


def slice_devices(cluster: Cluster, node: str) -> dict[str, dict[str, Any]]:
    return {
        device["name"]: device
        for item in slice_items(cluster, node)
        for device in item["spec"]["devices"]
    }


def shared_job(name: str, *, steps: int) -> dict[str, Any]:
    torch_volume, torch_mount = read_only_host_path(
        "torch", SITE_PACKAGES, "/usr/local/lib/python3.11/dist-packages"
    )
    scripts_volume, scripts_mount = read_only_host_path("scripts", SCRIPTS, "/scripts")
    worker = {"name": contract.WORKER_CONTAINER, "volumeMounts": [torch_mount, scripts_mount]}
    return job_manifest(
        name,
        workers=1,
        gpus=0,
        result=None,
        image=WORKER_IMAGE,
        command=["python", "/scripts/budgeted_mlp.py"],
        args=["--step-seconds", "0.3"],
        env=[{"name": "OMP_NUM_THREADS", "value": "1"}],
        runtime={"totalSteps": steps},  # features.submodel: auto, the default
        gpuSharing={"memory": "2Mi"},
        template_spec={
            "nodeSelector": ON_REAL_NODE,
            "containers": [worker],
            "volumes": [torch_volume, scripts_volume],
        },
    )


def claim_only_pod(name: str, uuid: str) -> list[dict[str, Any]]:
    """A pod with a claim on the GPU and no GPU variable of its own: what its container's
    environment says of the GPU, only the CDI edit can have put there."""
    selector = f'device.attributes["{contract.DRA_DRIVER}"].uuid == "{uuid}"'
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": contract.DRA_DEVICE_CLASS,
            "selectors": [{"cel": {"expression": selector}}],
            "capacity": {"requests": {contract.DRA_CAPACITY_MEMORY: "1Mi"}},
        }}]}},
    }  # fmt: skip
    # Prints, then stays (its claim is deallocated once the pod is done).
    show = ("import os, time; print(os.environ.get('NVIDIA_VISIBLE_DEVICES', 'unset'), "
            "flush=True); time.sleep(600)")  # fmt: skip
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": ON_REAL_NODE,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
            "containers": [{
                "name": "show", "image": WORKER_IMAGE, "imagePullPolicy": "Never",
                "command": ["python3", "-c", show],
                "resources": {"claims": [{"name": "gpu"}]},
            }],
        },
    }  # fmt: skip
    return [claim, pod]


def container_env(cluster: Cluster, namespace: str, pod: str) -> dict[str, str]:
    """The worker container's environment, read from inside it."""
    out = cluster.kubectl("exec", pod, "-n", namespace, "-c", contract.WORKER_CONTAINER,
                          "--", "env").stdout  # fmt: skip
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def cdi_devices(release: Release, namespace: str, pod: str) -> tuple[list[str], list[str]]:
    """The CDI devices the kubelet passed for the worker container (containerd keeps the
    CRI request) and the environment containerd wrote into its OCI spec."""
    info = release.container_info(namespace, pod, contract.WORKER_CONTAINER)
    devices = [d["name"] for d in info["config"].get("CDI_devices") or []]
    return devices, info["runtimeSpec"]["process"]["env"]


def held_to_budget(log: str) -> dict[str, Any]:
    """The run went through the allocator and every measured peak stayed in the budget."""
    (start,) = events(log, "start")
    assert start["report"]["submodel"].startswith(
        f"on: the measured peak {start['plain_peak']} B exceeds the budget {BUDGET} B"
    ), start["report"]
    assert start["report"]["arbiter"].startswith("on: turns from"), start["report"]
    assert start["plain_peak"] > BUDGET
    (done,) = events(log, "done")
    peaks: dict[str, Any] = done["peaks"]
    assert 0 < peaks["ledger"] <= BUDGET, peaks
    assert 0 < peaks["census"] <= BUDGET, peaks
    return peaks


@pytest.mark.timeout(180)
def test_the_kubelet_prepares_a_claim_and_containerd_applies_the_cdi_edit(
    release: Release, shared_gpu: str, namespace: str
) -> None:
    spec = json.loads(read_host(CDI_SPEC))
    assert spec["kind"] == contract.CDI_KIND
    assert {d["name"]: d["containerEdits"] for d in spec["devices"]} == {
        DEVICE: {"env": [f"{contract.ENV_NVIDIA_VISIBLE_DEVICES}={shared_gpu}"]}
    }
    assert host_has(REGISTRATION), "the agent's registration socket, where the kubelet looks"

    cdi_edit_reaches_a_claim_only_pod(release, namespace, "cdi-probe", shared_gpu)


def cdi_edit_reaches_a_claim_only_pod(
    release: Release, namespace: str, name: str, uuid: str
) -> None:
    """Run a pod with only a claim on the GPU: its container sees the GPU's UUID, the
    claim is allocated on the real node's device and the agent's plugin prepared it."""
    cluster = release.cluster
    apply(cluster, namespace, *claim_only_pod(name, uuid))
    running = wait_until(
        lambda: (p := get_json(cluster, namespace, "pod", name))["status"].get("phase")
        in ("Running", "Succeeded", "Failed") and p,
        90, "the claim-only pod to start",
    )  # fmt: skip
    assert running["spec"]["nodeName"] == release.node
    assert running["status"]["phase"] == "Running", running["status"]
    shown = wait_until(lambda: pod_logs(cluster, namespace, name, "show").strip(), 30,
                       "the claim-only pod's line")  # fmt: skip
    assert shown == uuid, f"NVIDIA_VISIBLE_DEVICES inside the container: {shown!r}"
    [result] = get_json(cluster, namespace, "resourceclaim", name)["status"][
        "allocation"]["devices"]["results"]  # fmt: skip
    assert (result["driver"], result["pool"], result["device"]) == (
        contract.DRA_DRIVER, release.node, DEVICE)  # fmt: skip
    prepared = [line for line in agent_log(release).splitlines()
                if f"claim={namespace}/{name} prepared devices=['{DEVICE}']" in line]  # fmt: skip
    assert prepared, "the agent's plugin logged no NodePrepareResources for the claim"
    cluster.kubectl("delete", "pod,resourceclaim", name, "-n", namespace, "--wait=true",
                    timeout=90)  # fmt: skip


@pytest.mark.timeout(480)
def test_two_jobs_share_one_gpu_within_their_budgets_and_survive_a_neighbour_kill(
    release: Release, shared_gpu: str, namespace: str
) -> None:
    cluster, steps = release.cluster, 80
    # Applied together, as a user would: the operator releases b's worker once a's is bound
    # (controller/releasing.py; docs/concepts/shared-gpus.md, "One GPU's workers in turn").
    apply(cluster, namespace, shared_job("a", steps=steps), shared_job("b", steps=steps))
    pods = {name: f"{name}-a0-worker-0" for name in ("a", "b")}

    def training(pod: str) -> bool:
        try:
            return len(events(pod_logs(cluster, namespace, pod, contract.WORKER_CONTAINER),
                              "step")) >= 3  # fmt: skip
        except Exception:  # not started yet: kubectl logs fails
            return False

    wait_until(lambda: all(training(p) for p in pods.values()), 240, "both jobs training")

    socket = arbiter_socket()
    for name, pod_name in pods.items():
        [pod] = worker_pods(cluster, namespace, name)
        assert pod["spec"]["nodeName"] == release.node
        assert pod["metadata"]["annotations"][contract.ANNOTATION_GPU_UUID] == shared_gpu
        claim = get_json(cluster, namespace, "resourceclaim",
                         pod["spec"]["resourceClaims"][0]["resourceClaimName"])  # fmt: skip
        # Seen once in a clean-clone run beside the chaos suite: a training worker's claim
        # read without an allocation. Say what the claim and its events were when it recurs.
        allocation = claim.get("status", {}).get("allocation")
        assert allocation is not None, (
            f"claim of a running worker has no allocation: {json.dumps(claim)}\n"
            + cluster.kubectl("get", "events", "-n", namespace, check=False).stdout
        )
        [result] = allocation["devices"]["results"]
        assert (result["pool"], result["device"]) == (release.node, DEVICE), result
        # From inside the container, as the process sees it.
        env = container_env(cluster, namespace, pod_name)
        assert env["NVIDIA_VISIBLE_DEVICES"] == env["CUDA_VISIBLE_DEVICES"] == shared_gpu
        assert env[contract.ENV_ARBITER_SOCKET] == socket
        assert env[contract.ENV_GPU_MEMORY_BUDGET] == str(BUDGET)
        # The kubelet passed the prepared CDI device; containerd applied its edit.
        devices, oci_env = cdi_devices(release, namespace, pod_name)
        assert devices == [CDI_ID], devices
        assert f"NVIDIA_VISIBLE_DEVICES={shared_gpu}" in oci_env

    # A third would overfill the GPU (2 + 2 + 2 MiB > 5 MiB): it waits, naming the GPU.
    apply(cluster, namespace, shared_job("c", steps=steps))
    waiting = wait_until(
        lambda: (c := condition(job(cluster, namespace, "c"), "Scheduled"))
        and c["reason"] == "NotEnoughGPUMemory" and c,
        60, "the third job to wait for GPU memory",
    )  # fmt: skip
    assert f"(GPU {shared_gpu} on node {release.node})" in waiting["message"]
    cluster.kubectl("delete", "tj", "c", "-n", namespace, "--wait=false")

    # SIGKILL a's worker container at once; b shares the GPU and must not notice.
    victim = release.container_id(namespace, pods["a"], contract.WORKER_CONTAINER)
    release.crictl("stop", "--timeout", "0", victim)
    observer = ArbiterClient(socket, job="observer")
    time.sleep(1)
    holders = observer.status()["holders"]
    observer.close()
    assert not [h for h in holders if str(h).startswith(f"{namespace}/a/")], holders

    done_b = wait_for_phase(cluster, namespace, "b", ("Succeeded", "Failed"), timeout=240)
    assert done_b["status"]["phase"] == "Succeeded", done_b["status"]
    log_b = pod_logs(cluster, namespace, pods["b"], contract.WORKER_CONTAINER)
    assert [e["step"] for e in events(log_b, "step")] == list(range(1, steps + 1))
    assert done_b["status"]["restarts"] == 0, "the neighbour's kill did not touch b"
    peaks_b = held_to_budget(log_b)

    # The killed job restarts its gang (a worker failure) and finishes on the same GPU.
    done_a = wait_for_phase(cluster, namespace, "a", ("Succeeded", "Failed"), timeout=240)
    assert done_a["status"]["phase"] == "Succeeded", done_a["status"]
    assert done_a["status"]["restarts"] == 1
    log_a = pod_logs(cluster, namespace, "a-a1-worker-0", contract.WORKER_CONTAINER)
    peaks_a = held_to_budget(log_a)
    losses = [e["loss"] for e in events(log_b, "step")]
    assert losses[-1] < losses[0], losses
    print(json.dumps({"budget": BUDGET, "a": peaks_a, "b": peaks_b}))  # the figures, for the log


@pytest.mark.timeout(180)
def test_a_restarted_kubelet_deletes_the_slices_and_the_agent_publishes_them_at_once(
    release: Release, shared_gpu: str, namespace: str
) -> None:
    """A kubelet that starts deletes every ResourceSlice of its node (v1.34.4, in the
    background, before or after it registers the plugins it finds again). The agent
    watches its slices and publishes them at once; its next pass (60 s) would leave the
    GPU without a slice, and no claim allocatable, until then."""
    cluster = release.cluster
    [before] = slice_items(cluster, release.node)
    restart_kubelet(cluster.state_dir)
    began = time.monotonic()

    def republished() -> dict[str, Any] | None:
        items = slice_items(cluster, release.node)
        fresh = [i for i in items if i["metadata"]["uid"] != before["metadata"]["uid"]]
        return fresh[0] if fresh else None

    after = wait_until(republished, 45, "the kubelet to delete the slice and the agent to "
                       "publish it again")  # fmt: skip
    seconds = time.monotonic() - began
    assert after["metadata"]["name"] == before["metadata"]["name"]
    assert seconds < 30, f"published again {seconds:.1f}s after the restart"
    # Logs come through the kubelet: wait until the new one serves them.
    cluster.kubectl("wait", "--for=condition=Ready", f"node/{release.node}", "--timeout=60s",
                    timeout=70)  # fmt: skip
    deleted = f"ResourceSlice {before['metadata']['name']} deleted: publishing again"
    wait_until(lambda: deleted in try_agent_log(release), 60, "the agent's log of the delete")
    # The new kubelet found the plugin again: a claim is prepared and the CDI edit applied.
    cdi_edit_reaches_a_claim_only_pod(release, namespace, "after-restart", shared_gpu)
    print(f"slice published again {seconds:.1f}s after the kubelet restart")
