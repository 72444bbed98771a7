"""The trace's pods as the tasks the operator builds: TrainingJobs through its own code.

Used by fgd_trace.py (`--tasks operator`, `--tasks operator-cpu-blind`). Each trace pod
(cpu_milli, memory_mib, num_gpu, gpu_milli) becomes a one-worker TrainingJob:

- spec.resources.requests: cpu = the pod's cpu_milli, memory = its memory_mib;
- spec.runtime: {} with a command, as examples/shared-gpu-finetune.yaml does (the
  runtime adds its installer init container, 100m CPU / 64Mi memory);
- a fraction of one GPU (gpu_milli < 1000): spec.gpuSharing.memory = gpu_milli / 1000
  of a reference GPU of REFERENCE_GPU_MIB (16,000 MiB: milli -> MiB -> milli is exact);
  whole GPUs: spec.gpusPerWorker = num_gpu; CPU-only: neither.

The job is resolved (trainwave.resolving.resolve), its worker pod built
(builders.pods.build_worker_pods) and read as kube-scheduler would (pod_needs:
containers, init-container peak, overhead); a shared worker's task is then
shared_tasks.worker_task, the operator's own builder; whole-GPU and CPU-only pods
keep the pod's CPU and memory with their GPUs. Memory is in bytes, so the nodes'
memory is converted to bytes too. GPU-model constraints (gpu_spec) stay on the task:
the operator expresses them as node selection, outside the packer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from functools import cache

from trainwave import contract
from trainwave.builders.pods import build_worker_pods
from trainwave.placement.packing import NodeState, Task
from trainwave.placement.quantities import CPU, MEMORY
from trainwave.placement.requirements import pod_needs
from trainwave.placement.shared_tasks import UNTRACKED, gpu_milli, worker_task
from trainwave.resolving import resolve

REFERENCE_GPU_MIB = 16_000
MIB = 2**20


def job_body(cpu_milli: int, memory_mib: int, num_gpu: int, milli: int) -> dict[str, object]:
    """The TrainingJob a user would write for one trace pod (see the module docstring)."""
    spec: dict[str, object] = {
        "workers": 1,
        "image": "example/train:1.0",
        "command": ["python", "train.py"],
        "runtime": {},
        "resources": {"requests": {"cpu": f"{cpu_milli}m", "memory": f"{memory_mib}Mi"}},
    }
    if 0 < milli < 1000:
        spec["gpuSharing"] = {"memory": f"{milli * REFERENCE_GPU_MIB // 1000}Mi"}
    elif num_gpu:
        spec["gpusPerWorker"] = num_gpu
    return {
        "apiVersion": contract.API_VERSION,
        "kind": contract.KIND,
        "metadata": {"name": "trace-pod", "namespace": "default", "uid": "trace"},
        "spec": spec,
    }


@cache
def built_task(cpu_milli: int, memory_mib: int, num_gpu: int, milli: int) -> Task:
    """The task the operator builds for one trace pod's TrainingJob (cached per shape)."""
    resolved = resolve(job_body(cpu_milli, memory_mib, num_gpu, milli))
    [pod] = build_worker_pods(resolved, (0,), 0)
    needs = pod_needs(pod)
    if resolved.shared is not None:
        mib = needs.amount(contract.SHARED_GPU_MEMORY_RESOURCE)
        return worker_task(needs, gpu_milli(mib, REFERENCE_GPU_MIB))
    gpus = needs.amount(contract.GPU_RESOURCE)
    return Task(needs.amount(CPU), needs.amount(MEMORY), gpus, 1000 if gpus else 0)


def operator_tasks(pods: Sequence[Task]) -> list[Task]:
    """Each trace task replaced by the operator's, GPU-model constraints kept."""
    return [
        replace(built_task(p.cpu_milli, p.memory, p.num_gpu, p.gpu_milli), gpu_models=p.gpu_models)
        for p in pods
    ]


def in_bytes(nodes: Sequence[NodeState]) -> list[NodeState]:
    return [replace(n, memory_free=n.memory_free * MIB) for n in nodes]


def cpu_blind(node: NodeState) -> NodeState:
    """The node as the packer saw it before shared tasks carried CPU and memory."""
    return replace(node, cpu_free=UNTRACKED, memory_free=UNTRACKED)


def blind_task(task: Task) -> Task:
    return replace(task, cpu_milli=0, memory=0)
