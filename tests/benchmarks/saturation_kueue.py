"""The saturation benchmark's peer: the same stream admitted by Kueue as batch Jobs.

Each gang of the stream becomes one batch Job (parallelism = completions = its workers,
each worker the same 8 GPUs, CPU and memory, the same kwok run-time annotations as the
TrainingJob's workers), created suspended with the `kueue.x-k8s.io/queue-name` label
(what Kueue's Job webhook sets too; its webhooks are installed as its release installs
them, tests/cluster/kueue.py) at the gang's arrival time. Kueue admits a Job's Workload whole
(all-or-nothing quota reservation), unsuspends it, the Job controller creates its pods and
kube-scheduler binds them; kwok runs them for their run time exactly as it runs trainwave's.

The queue, as Kueue documents all-or-nothing admission for batch Jobs:
- one ResourceFlavor on every node and one ClusterQueue whose quota is the whole cluster
  (the sum of the nodes' allocatable GPUs, CPU and memory), BestEffortFIFO (its default:
  a Workload that does not fit lets later ones be tried: unbounded backfill);
- the client rate (50/s, burst 100) and controller concurrency of Kueue's own install;
- waitForPodsReady enabled (all-or-nothing "with ready pods"), blockAdmission off: with
  the quota equal to the cluster and every worker a whole node's GPUs, every admitted Job
  fits the free nodes, so serialising admissions would only slow Kueue down;
- Topology Aware Scheduling (beta, on by default in v0.17; BENCH_KUEUE_TAS=0 turns it off):
  a Topology of spine / rack / hostname on the flavor, and each Job's pods prefer one rack
  (`kueue.x-k8s.io/podset-preferred-topology`), the level trainwave prefers. Kueue then
  picks the nodes, gates the pods (`kueue.x-k8s.io/topology`) and ungates them with a
  node selector; kube-scheduler binds them there. Without TAS kube-scheduler picks.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.operator_cluster import fresh_namespace
from benchmarks.saturation_stream import (
    CPU_PER_GPU,
    IMAGE,
    MEMORY_GIB_PER_GPU,
    NODE_GPUS,
    SatJob,
    send_at_arrivals,
)
from benchmarks.saturation_watch import PodWatch, WorkloadWatch
from cluster.api import ApiClient
from cluster.controlplane import Cluster
from cluster.kueue import KueueManager, preferred_version, start_kueue
from cluster.topology import GPU_RESOURCE, KWOK_NODE_TYPE, KWOK_NODE_TYPE_LABEL
from trainwave import contract

QUEUE = "saturation"
JOB_LABEL = "batch.kubernetes.io/job-name"  # on every pod the Job controller creates
TOPOLOGY_LEVELS = (contract.NODE_LABEL_SPINE, contract.NODE_LABEL_RACK, "kubernetes.io/hostname")
PODS_READY_TIMEOUT = "5m"
ACTIVE_TIMEOUT = 60.0


@dataclass
class PeerRun:
    arrivals: dict[str, float]
    watcher: PodWatch
    finished: bool
    tas: bool
    api_version: str
    setup: dict[str, Any]  # what the queue was: quotas, strategy, TAS levels
    workloads: dict[str, dict[str, float]]  # per Job: admitted, finished (WorkloadWatch)


def kueue_configuration() -> dict[str, Any]:
    """What the peer adds to tests/cluster/kueue.py's manager configuration: waitForPodsReady,
    and the client rate and concurrency Kueue's own install ships
    (config/components/manager/controller_manager_config.yaml in v0.17.0); without them the
    code's defaults apply (20 requests/s, burst 30), and a first run spent up to 17 s of a
    burst of 26 admissions before the Jobs' pods existed."""
    return {
        "waitForPodsReady": {
            "enable": True,
            "blockAdmission": False,
            "timeout": PODS_READY_TIMEOUT,
        },
        "clientConnection": {"qps": 50, "burst": 100},
        "controller": {"groupKindConcurrency": {
            "Job.batch": 5, "Pod": 5, "Workload.kueue.x-k8s.io": 5,
            "LocalQueue.kueue.x-k8s.io": 1, "Cohort.kueue.x-k8s.io": 1,
            "ClusterQueue.kueue.x-k8s.io": 1, "ResourceFlavor.kueue.x-k8s.io": 1,
        }},
    }  # fmt: skip


def cluster_quota(nodes: list[dict[str, Any]]) -> dict[str, str]:
    """The sum of the nodes' allocatable GPUs, CPU and memory (Gi), as nominal quota."""
    gpus = cpu = 0
    memory_gi = 0
    for node in nodes:
        allocatable = node["status"]["allocatable"]
        gpus += int(allocatable.get(GPU_RESOURCE, 0))
        cpu += int(allocatable["cpu"])
        memory_gi += memory_in_gi(allocatable["memory"])
    return {GPU_RESOURCE: str(gpus), "cpu": str(cpu), "memory": f"{memory_gi}Gi"}


def memory_in_gi(quantity: str) -> int:
    """A whole-Gi memory quantity ("2Ti", "1024Gi"); others are refused, by value."""
    for suffix, factor in (("Ti", 1024), ("Gi", 1)):
        if quantity.endswith(suffix) and quantity[: -len(suffix)].isdigit():
            return int(quantity[: -len(suffix)]) * factor
    raise ValueError(f"node memory {quantity!r}: expected whole Gi or Ti, e.g. '2Ti'")


def queue_objects(api: str, quota: dict[str, str], *, tas: bool) -> list[dict[str, Any]]:
    """Topology (with TAS), ResourceFlavor, ClusterQueue, LocalQueue (namespaced)."""
    flavor: dict[str, Any] = {"nodeLabels": {KWOK_NODE_TYPE_LABEL: KWOK_NODE_TYPE}}  # all nodes
    objects: list[dict[str, Any]] = []
    if tas:
        objects.append({
            "apiVersion": api, "kind": "Topology", "metadata": {"name": QUEUE},
            "spec": {"levels": [{"nodeLabel": label} for label in TOPOLOGY_LEVELS]},
        })  # fmt: skip
        flavor["topologyName"] = QUEUE
    objects += [
        {"apiVersion": api, "kind": "ResourceFlavor", "metadata": {"name": QUEUE},
         "spec": flavor},
        {"apiVersion": api, "kind": "ClusterQueue", "metadata": {"name": QUEUE}, "spec": {
            "namespaceSelector": {},  # nil would admit no namespace
            "queueingStrategy": "BestEffortFIFO",
            "resourceGroups": [{
                "coveredResources": sorted(quota),
                "flavors": [{"name": QUEUE, "resources": [
                    {"name": name, "nominalQuota": value}
                    for name, value in sorted(quota.items())]}],
            }],
        }},
        {"apiVersion": api, "kind": "LocalQueue", "metadata": {"name": QUEUE},
         "spec": {"clusterQueue": QUEUE}},
    ]  # fmt: skip
    return objects


def batch_job(job: SatJob, namespace: str, *, tas: bool) -> dict[str, Any]:
    """One gang as a suspended batch Job for the LocalQueue; its workers as the
    TrainingJob's (training_job in saturation_stream.py): same requests, same run time."""
    annotations = {contract.SIM_RESULT: "Succeeded", contract.SIM_RUN_FOR: f"{job.run_seconds}s"}
    if tas:
        annotations["kueue.x-k8s.io/podset-preferred-topology"] = contract.NODE_LABEL_RACK
    resources = {
        "cpu": str(CPU_PER_GPU * NODE_GPUS),
        "memory": f"{MEMORY_GIB_PER_GPU * NODE_GPUS}Gi",
        GPU_RESOURCE: str(NODE_GPUS),
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": job.name,
            "namespace": namespace,
            "labels": {"kueue.x-k8s.io/queue-name": QUEUE},
        },
        "spec": {
            "suspend": True,
            "parallelism": job.workers,
            "completions": job.workers,
            "backoffLimit": 0,
            "template": {
                "metadata": {"annotations": annotations},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{
                        "name": "worker", "image": IMAGE, "command": ["python", "train.py"],
                        "resources": {"requests": resources, "limits": resources},
                    }],
                },
            },
        },
    }  # fmt: skip


@contextmanager
def kueue_running(cluster: Cluster, workdir: Path) -> Iterator[KueueManager]:
    manager = start_kueue(cluster, workdir, extra_configuration=kueue_configuration())
    try:
        yield manager
    finally:
        manager.stop()


def run_peer(
    cluster: Cluster,
    client: ApiClient,
    workdir: Path,
    stream: list[SatJob],
    namespace: str,
    *,
    tas: bool,
    drain_timeout: float,
) -> PeerRun:
    """Start Kueue, set up its queue, feed it the stream as Jobs, wait until every worker
    ended; Kueue is stopped afterwards."""
    fresh_namespace(cluster, namespace)
    with kueue_running(cluster, workdir):
        api = preferred_version(cluster)
        quota = cluster_quota(client.get("/api/v1/nodes")["items"])
        objects = queue_objects(api, quota, tas=tas)
        for manifest in objects:
            create(client, manifest, namespace)
        # Jobs sent before the ClusterQueue is active would first be found inadmissible and
        # wait for a requeue: trainwave's side starts with its operator ready too.
        wait_active(client, f"/apis/{api}/clusterqueues/{QUEUE}")
        wait_active(client, f"/apis/{api}/namespaces/{namespace}/localqueues/{QUEUE}")
        watcher = PodWatch(cluster, namespace, job_label=JOB_LABEL)
        watcher.start()
        workloads = WorkloadWatch(cluster, api, namespace, watcher.t0)
        workloads.start()
        arrivals = submit_jobs(client, stream, namespace, watcher.t0, tas=tas)
        finished = wait_ended(watcher, sum(job.workers for job in stream), drain_timeout)
        watcher.stop()
        workloads.stop()
        for manifest in reversed(objects):
            if manifest["kind"] != "LocalQueue":
                cluster.kubectl("delete", manifest["kind"].lower(), QUEUE, "--wait=false",
                                check=False)  # fmt: skip
    cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
    setup = {
        "quota": quota,
        "queueing_strategy": "BestEffortFIFO",
        "configuration": kueue_configuration(),
        "topology_aware_scheduling": list(TOPOLOGY_LEVELS) if tas else "off",
        "preferred_topology": contract.NODE_LABEL_RACK if tas else None,
    }
    return PeerRun(arrivals, watcher, finished, tas, api, setup, workloads.jobs)


def create(client: ApiClient, manifest: dict[str, Any], namespace: str) -> None:
    group, version = manifest["apiVersion"].split("/")
    plural = {"Topology": "topologies"}.get(manifest["kind"], manifest["kind"].lower() + "s")
    where = f"/namespaces/{namespace}" if manifest["kind"] == "LocalQueue" else ""
    client.request("POST", f"/apis/{group}/{version}{where}/{plural}", manifest)


def wait_active(client: ApiClient, path: str, timeout: float = ACTIVE_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    conditions: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        conditions = client.get(path).get("status", {}).get("conditions", [])
        if any(c["type"] == "Active" and c["status"] == "True" for c in conditions):
            return
        time.sleep(0.5)
    raise TimeoutError(f"{path} not Active after {timeout:.0f}s; its conditions: {conditions}")


def submit_jobs(
    client: ApiClient, stream: list[SatJob], namespace: str, t0: float, *, tas: bool
) -> dict[str, float]:
    """Create each Job at its arrival time (as submit() does the TrainingJobs)."""
    path = f"/apis/batch/v1/namespaces/{namespace}/jobs"
    arrivals = send_at_arrivals(
        lambda job: client.request("POST", path, batch_job(job, namespace, tas=tas)), stream, t0
    )
    print(f"peer: submitted {len(stream)} Jobs in {time.time() - t0:.0f}s", flush=True)
    return arrivals


def wait_ended(watcher: PodWatch, workers: int, timeout: float) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if sum(1 for p in list(watcher.pods.values()) if "ended" in p) >= workers:
            return True
        time.sleep(1.0)
    return False
