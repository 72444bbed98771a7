"""Names shared by the operator, the chart, the simulator and the worker runtime.

Pure: imports nothing. Every label, annotation, environment variable and port
that crosses a process boundary is spelled here once, so the operator that
writes a name and the code that reads it cannot drift apart.
"""

from typing import Final

GROUP: Final = "trainwave.io"
VERSION: Final = "v1alpha1"
KIND: Final = "TrainingJob"
PLURAL: Final = "trainingjobs"
SINGULAR: Final = "trainingjob"
SHORT_NAMES: Final = ("tj",)
API_VERSION: Final = f"{GROUP}/{VERSION}"

# Server-side apply field manager and the controller name on Events.
FIELD_MANAGER: Final = "trainwave"
REPORTING_CONTROLLER: Final = "trainwave.io/operator"

# Labels on every child object; selectors are built from these.
LABEL_JOB_NAME: Final = "trainwave.io/job-name"
LABEL_ROLE: Final = "trainwave.io/role"
LABEL_RANK: Final = "trainwave.io/rank"
LABEL_ATTEMPT: Final = "trainwave.io/attempt"
# On a worker replaced alone: the replacement's serial, which also ends its pod's name.
LABEL_REPLACEMENT: Final = "trainwave.io/replacement"
ROLE_WORKER: Final = "worker"

# Kueue (v0.11 to v0.17): a job with this label is admitted through a Workload that
# trainwave creates and owns (lifecycle/admission.py). The API versions trainwave speaks,
# preferred first: Kueue serves v1beta2 from v0.15 and plans to drop v1beta1 in v0.18; the
# operator uses the first one the API server serves (controller/kueue_api.py).
KUEUE_QUEUE_LABEL: Final = "kueue.x-k8s.io/queue-name"
KUEUE_GROUP: Final = "kueue.x-k8s.io"
KUEUE_VERSIONS: Final = ("v1beta2", "v1beta1")
KUEUE_VERSION: Final = KUEUE_VERSIONS[0]
KUEUE_WORKLOADS: Final = "workloads"
KUEUE_FLAVORS: Final = "resourceflavors"
KUEUE_POD_SET: Final = "workers"  # the Workload's one pod set

# The container the operator fills in; a template may pre-declare it.
WORKER_CONTAINER: Final = "worker"
MASTER_PORT_NAME: Final = "rendezvous"
DEFAULT_MASTER_PORT: Final = 29500

# Annotations the kwok simulator stages read (tests/cluster/stages). A pod
# carrying them finishes `run-for` after it starts Running, with `result`
# Succeeded or Failed and, when failed, `exit-code`.
SIM_RESULT: Final = "sim.trainwave.io/result"
SIM_RUN_FOR: Final = "sim.trainwave.io/run-for"
SIM_EXIT_CODE: Final = "sim.trainwave.io/exit-code"

# Classic torch.distributed environment (read by init_process_group "env://").
ENV_MASTER_ADDR: Final = "MASTER_ADDR"
ENV_MASTER_PORT: Final = "MASTER_PORT"
ENV_WORLD_SIZE: Final = "WORLD_SIZE"
ENV_RANK: Final = "RANK"
ENV_LOCAL_RANK: Final = "LOCAL_RANK"
ENV_LOCAL_WORLD_SIZE: Final = "LOCAL_WORLD_SIZE"
ENV_NODE_RANK: Final = "NODE_RANK"
# torchrun reads PET_<FLAG> as the default of --<flag>, so `torchrun train.py`
# needs no arguments inside a trainwave pod.
ENV_PET_NNODES: Final = "PET_NNODES"
ENV_PET_NPROC_PER_NODE: Final = "PET_NPROC_PER_NODE"
ENV_PET_NODE_RANK: Final = "PET_NODE_RANK"
ENV_PET_MASTER_ADDR: Final = "PET_MASTER_ADDR"
ENV_PET_MASTER_PORT: Final = "PET_MASTER_PORT"
# In-place restarts (spec.runtime.inPlaceRestarts > 0, with the runtime): torchrun's
# elastic agent with the c10d rendezvous instead of the static one, so a failed
# process restarts every process of the gang inside the running pods
# (torch/distributed/run.py reads these as the defaults of --rdzv-backend, ...).
ENV_PET_RDZV_BACKEND: Final = "PET_RDZV_BACKEND"
ENV_PET_RDZV_ENDPOINT: Final = "PET_RDZV_ENDPOINT"  # rank 0's DNS name:RDZV_PORT
ENV_PET_RDZV_ID: Final = "PET_RDZV_ID"  # <job uid>-a<attempt>: a new attempt, a new rendezvous
ENV_PET_RDZV_CONF: Final = "PET_RDZV_CONF"  # is_host=true on rank 0 only
ENV_PET_MAX_RESTARTS: Final = "PET_MAX_RESTARTS"
ENV_PET_LOCAL_ADDR: Final = "PET_LOCAL_ADDR"  # the worker's own <hostname>.<service>
# Every worker's address, `{rank}` standing for its rank: where a replaced store host's
# launcher tells the others its address (runtime/launcher/announce.py).
ENV_WORKER_ADDRESS: Final = "TRAINWAVE_WORKER_ADDRESS"
# The pod's own IP (the downward API's status.podIP), given to worker 0 with in-place
# restarts: its agent names itself by it, so MASTER_ADDR needs no DNS (launch.py).
ENV_POD_IP: Final = "TRAINWAVE_POD_IP"
# "true" on a pod that replaces its worker alone in a running gang (runPolicy.workerReplacement):
# a replaced worker 0 announces its address to the others (launcher/announce.py).
ENV_REPLACEMENT: Final = "TRAINWAVE_REPLACEMENT"
RDZV_BACKEND: Final = "c10d"
# The c10d store's port on rank 0 (torch's own default, c10d_rendezvous_backend.py
# DEFAULT_PORT); the builders take the next free one when the job's masterPort or
# statusPort is this.
DEFAULT_RDZV_PORT: Final = 29400
RDZV_PORT_NAME: Final = "tw-rdzv"
# trainwave's own variables for the runtime.
ENV_JOB_NAME: Final = "TRAINWAVE_JOB_NAME"
ENV_JOB_NAMESPACE: Final = "TRAINWAVE_JOB_NAMESPACE"
ENV_ATTEMPT: Final = "TRAINWAVE_ATTEMPT"
# spec.runPolicy.hangTimeoutSeconds, for the launcher's hang watchdog (in-place only).
ENV_HANG_TIMEOUT_SECONDS: Final = "TRAINWAVE_HANG_TIMEOUT_SECONDS"
# spec.runPolicy.preflight, for the launcher's bandwidth test before the first step
# (runtime/preflight.py); unset = no test.
ENV_PREFLIGHT_SIZE_MIB: Final = "TRAINWAVE_PREFLIGHT_SIZE_MIB"
ENV_PREFLIGHT_TIMEOUT_SECONDS: Final = "TRAINWAVE_PREFLIGHT_TIMEOUT_SECONDS"

# Users may not set these: the operator owns them, and a user value would
# silently break rendezvous for the whole gang.
RESERVED_ENV: Final = (
    ENV_MASTER_ADDR,
    ENV_MASTER_PORT,
    ENV_WORLD_SIZE,
    ENV_RANK,
    ENV_LOCAL_RANK,
    ENV_LOCAL_WORLD_SIZE,
    ENV_NODE_RANK,
    ENV_PET_NNODES,
    ENV_PET_NPROC_PER_NODE,
    ENV_PET_NODE_RANK,
    ENV_PET_MASTER_ADDR,
    ENV_PET_MASTER_PORT,
    ENV_PET_RDZV_BACKEND,
    ENV_PET_RDZV_ENDPOINT,
    ENV_PET_RDZV_ID,
    ENV_PET_RDZV_CONF,
    ENV_PET_MAX_RESTARTS,
    ENV_PET_LOCAL_ADDR,
    ENV_WORKER_ADDRESS,
    ENV_POD_IP,
    ENV_REPLACEMENT,
    ENV_JOB_NAME,
    ENV_JOB_NAMESPACE,
    ENV_ATTEMPT,
    ENV_HANG_TIMEOUT_SECONDS,
    ENV_PREFLIGHT_SIZE_MIB,
    ENV_PREFLIGHT_TIMEOUT_SECONDS,
)

GPU_RESOURCE: Final = "nvidia.com/gpu"

# NCCL's own variables, as the operator sets them (builders/network.py), the
# launcher defaults them (runtime/launcher/environment.py) and the doctor checks them.
ENV_NCCL_IB_HCA: Final = "NCCL_IB_HCA"  # which RDMA ports: "=mlx5_0:1,mlx5_1:1"
ENV_NCCL_IB_GID_INDEX: Final = "NCCL_IB_GID_INDEX"  # RoCE: the GID of RoCE v2
ENV_NCCL_IB_DISABLE: Final = "NCCL_IB_DISABLE"
ENV_NCCL_NET: Final = "NCCL_NET"  # "Socket" forces TCP
ENV_NCCL_NET_GDR_LEVEL: Final = "NCCL_NET_GDR_LEVEL"  # farthest GPU<->NIC path for GPUDirect
ENV_NCCL_SOCKET_IFNAME: Final = "NCCL_SOCKET_IFNAME"
ENV_NCCL_DEBUG: Final = "NCCL_DEBUG"
ENV_NCCL_DEBUG_SUBSYS: Final = "NCCL_DEBUG_SUBSYS"
ENV_NCCL_DEBUG_FILE: Final = "NCCL_DEBUG_FILE"

# Node labels written by the topology (and, later, by the node agent).
NODE_LABEL_SPINE: Final = "trainwave.io/spine"
NODE_LABEL_RACK: Final = "trainwave.io/rack"
NODE_LABEL_NVLINK_DOMAIN: Final = "trainwave.io/nvlink-domain"
NODE_LABEL_GPU_PRODUCT: Final = "nvidia.com/gpu.product"
NODE_LABEL_GPU_COUNT: Final = "nvidia.com/gpu.count"
NODE_LABEL_GPU_MEMORY: Final = "nvidia.com/gpu.memory"
NODE_LABEL_GPU_CLIQUE: Final = "nvidia.com/gpu.clique"
NODE_LABEL_RDMA: Final = "trainwave.io/rdma"
NODE_LABEL_RDMA_NICS: Final = "trainwave.io/rdma-nics"
RDMA_RESOURCE: Final = "rdma/rdma_shared_device_a"
# "true" where GPUDirect RDMA works (a peer-memory module or DMA-BUF, and an
# active RDMA port), "false" where RDMA does but GPUDirect does not.
NODE_LABEL_GPUDIRECT: Final = "trainwave.io/gpudirect-rdma"
# Multus reads the pod's extra networks from this annotation.
ANNOTATION_MULTUS_NETWORKS: Final = "k8s.v1.cni.cncf.io/networks"
# The value of NODE_LABEL_RDMA for each RDMA link layer.
RDMA_LINK_LAYER_LABELS: Final = {"IB": "infiniband", "RoCE": "roce"}
# The node agent's full inventory (GPUs, NVLink islands, NICs, GPU-to-NIC
# distances, GPUDirect readiness) as a JSON annotation on the node.
ANNOTATION_INVENTORY: Final = "trainwave.io/inventory"
# The label keys the agent wrote last time, comma-separated: on its next pass
# it removes those it no longer finds, and never touches any other label.
ANNOTATION_AGENT_LABELS: Final = "trainwave.io/agent-labels"
# GPU memory a node offers for sharing, in MiB (extended resources are
# integers): the sum over the GPUs the agent was told to share. The scheduler
# accounts it per node; the operator pins each pod to one GPU by UUID, read
# from the inventory annotation's `sharedGpus`.
SHARED_GPU_MEMORY_RESOURCE: Final = "trainwave.io/gpu-memory"
# Field manager of the agent's node patches (managedFields show who wrote what).
AGENT_FIELD_MANAGER: Final = "trainwave-agent"
# The shared GPU a worker was pinned to (its UUID), set when its gate is lifted.
ANNOTATION_GPU_UUID: Final = "trainwave.io/gpu-uuid"
# The DaemonSet passes its node's name through the downward API.
ENV_NODE_NAME: Final = "NODE_NAME"

# --- Placement mechanism -------------------------------------------------
# Worker pods are created behind this scheduling gate; the operator lifts it
# on every pod of the gang together once the whole gang has a place.
SCHEDULING_GATE: Final = "trainwave.io/placement"
# Set on each pod when its gate is lifted: the node the engine chose, and the
# environment that depends on that node (NCCL_IB_HCA for the GPU's nearest
# NIC, the pinned GPU's UUID, ...) as a JSON object. Pod env is immutable
# after creation; annotations are not, and the downward API volume below
# hands them to the launcher, which exports them before it starts training.
ANNOTATION_PLACED_NODE: Final = "trainwave.io/node"
ANNOTATION_WORKER_ENV: Final = "trainwave.io/worker-env"
# When the gate was lifted (RFC 3339): the bind timeout counts from here.
ANNOTATION_RELEASED_AT: Final = "trainwave.io/released-at"
# How tightly the gang sits ("4 workers x 8 GPUs on 4 nodes, 1 rack"), on every pod.
ANNOTATION_PLACEMENT_SUMMARY: Final = "trainwave.io/placement"
# Written on every worker pod by the builder, so a running gang's priority and
# whether it may be preempted are known from its pods alone (watch cache).
ANNOTATION_PRIORITY: Final = "trainwave.io/priority"
ANNOTATION_PREEMPTIBLE: Final = "trainwave.io/preemptible"
# runPolicy.maxRunSeconds, on every worker pod by the builder: with released-at, the time
# by which the placed gang is stopped, which the queue's backfill counts on (one source
# for both the deadline and the queue, read from the pods alone).
ANNOTATION_MAX_RUN_SECONDS: Final = "trainwave.io/max-run-seconds"
# Set by the placer on each pod of a gang it preempts (the preemptor, namespace/name)
# just before deleting it; the victim's next attempt then restarts uncounted.
ANNOTATION_PREEMPTED_BY: Final = "trainwave.io/preempted-by"
# On the pods of a later attempt: when an earlier one was preempted (RFC 3339), so
# the gang is not preempted again within the grace period.
ANNOTATION_PREEMPTED_AT: Final = "trainwave.io/preempted-at"

# --- Acceleration runtime (runs inside the worker container) -------------
# The init container copies the runtime here; PYTHONPATH points at it.
RUNTIME_VOLUME: Final = "trainwave-runtime"
RUNTIME_INIT_CONTAINER: Final = "trainwave-runtime"
# The module the init container runs to copy the runtime into the volume.
RUNTIME_INSTALLER: Final = "trainwave.runtime.install"
RUNTIME_LAUNCHER: Final = "trainwave.runtime.launch"
DEFAULT_RUNTIME_IMAGE: Final = "trainwave/runtime:0.1.0"
STATUS_PORT_NAME: Final = "tw-status"
RUNTIME_MOUNT_PATH: Final = "/opt/trainwave"
# Downward API volume with the pod's annotations (file "annotations").
PODINFO_VOLUME: Final = "trainwave-podinfo"
PODINFO_MOUNT_PATH: Final = "/etc/trainwave/podinfo"
ENV_PODINFO_DIR: Final = "TRAINWAVE_PODINFO_DIR"
# One variable per feature, value "on", "off" or "auto" (compression also
# takes "fp16", "bf16" or "powersgd"): TRAINWAVE_FEATURE_AMP=auto, ...
ENV_FEATURE_PREFIX: Final = "TRAINWAVE_FEATURE_"
RUNTIME_FEATURES: Final = (
    "tf32",
    "amp",
    "fused_optimizer",
    "ddp_buckets",
    "compression",
    "hierarchical_allreduce",
    "prefetch",
    "length_grouping",
    "checkpoint",
    "doctor",
    "telemetry",
    "cuda_graphs",
    "compile",
    "submodel",
    "warm_start",
)
FEATURE_MODES: Final = ("on", "off", "auto")
# Extra modules (comma-separated) the warm start imports before the first generation,
# beside torch: a worker's own heavy imports (transformers, ...) then cost nothing on restart.
ENV_WARM_PRELOAD: Final = "TRAINWAVE_WARM_PRELOAD"
COMPRESSION_MODES: Final = ("off", "auto", "fp16", "bf16", "powersgd")
ENV_CHECKPOINT_DIR: Final = "TRAINWAVE_CHECKPOINT_DIR"
ENV_CHECKPOINT_EVERY_STEPS: Final = "TRAINWAVE_CHECKPOINT_EVERY_STEPS"
# How many complete checkpoints to keep; older ones are deleted after a save.
ENV_CHECKPOINT_KEEP: Final = "TRAINWAVE_CHECKPOINT_KEEP"
# Data-loader defaults the launcher computes (CPU quota, CUDA presence) and
# prepare() applies to loaders the user built without choosing them.
ENV_LOADER_NUM_WORKERS: Final = "TRAINWAVE_LOADER_NUM_WORKERS"
ENV_LOADER_PIN_MEMORY: Final = "TRAINWAVE_LOADER_PIN_MEMORY"
ENV_LOADER_PERSISTENT_WORKERS: Final = "TRAINWAVE_LOADER_PERSISTENT_WORKERS"
ENV_LOADER_PREFETCH_FACTOR: Final = "TRAINWAVE_LOADER_PREFETCH_FACTOR"
# Threads per loader worker fetching the items of one batch concurrently.
ENV_LOADER_FETCH_THREADS: Final = "TRAINWAVE_LOADER_FETCH_THREADS"
# Progress reports: total steps (for the ETA) and the minimum seconds
# between two progress writes.
ENV_TOTAL_STEPS: Final = "TRAINWAVE_TOTAL_STEPS"
ENV_TELEMETRY_INTERVAL_SECONDS: Final = "TRAINWAVE_TELEMETRY_INTERVAL_SECONDS"
# Topology hints the operator passes so `auto` can choose a comm strategy.
ENV_INTER_NODE_GBPS: Final = "TRAINWAVE_INTER_NODE_GBPS"
ENV_INTRA_NODE_GBPS: Final = "TRAINWAVE_INTRA_NODE_GBPS"
# Shared GPUs: this worker's device-memory budget and the node-local arbiter.
ENV_GPU_MEMORY_BUDGET: Final = "TRAINWAVE_GPU_MEMORY_BUDGET_BYTES"
ENV_ARBITER_SOCKET: Final = "TRAINWAVE_ARBITER_SOCKET"
# The UUID of the GPU a shared worker was placed on, read by the kubelet from the
# ANNOTATION_GPU_UUID annotation (downward API) when the container starts.
ENV_GPU_UUID: Final = "TRAINWAVE_GPU_UUID"
# What the NVIDIA container runtime (NVIDIA_VISIBLE_DEVICES: which device nodes the
# container gets) and CUDA (CUDA_VISIBLE_DEVICES: which of those it enumerates) read.
ENV_NVIDIA_VISIBLE_DEVICES: Final = "NVIDIA_VISIBLE_DEVICES"
ENV_CUDA_VISIBLE_DEVICES: Final = "CUDA_VISIBLE_DEVICES"
# Names a shared worker may not set: the operator pins and budgets it with them.
SHARED_GPU_ENV: Final = (
    ENV_GPU_MEMORY_BUDGET,
    ENV_ARBITER_SOCKET,
    ENV_GPU_UUID,
    ENV_NVIDIA_VISIBLE_DEVICES,
    ENV_CUDA_VISIBLE_DEVICES,
)
# The node-local arbiter (one unix socket per shared GPU, `<uuid>.sock`) lives in
# this host directory; the agent writes the shared GPUs and their bytes into
# ARBITER_GPUS_FILE there, and the arbiter container serves one socket per entry.
DEFAULT_ARBITER_DIR: Final = "/run/trainwave/arbiter"
ARBITER_GPUS_FILE: Final = "gpus.json"
ARBITER_VOLUME: Final = "trainwave-arbiter"
# Where the runtime writes its reports (doctor, telemetry) as JSON files.
ENV_REPORT_DIR: Final = "TRAINWAVE_REPORT_DIR"
# Each worker's runtime serves GET /status (JSON: doctor report, progress)
# on this port; the operator reads it and writes the job's status.
ENV_STATUS_PORT: Final = "TRAINWAVE_STATUS_PORT"
# The address it binds; all interfaces in a pod, loopback in tests.
ENV_STATUS_HOST: Final = "TRAINWAVE_STATUS_HOST"
DEFAULT_STATUS_HOST: Final = "0.0.0.0"
DEFAULT_STATUS_PORT: Final = 29600
STATUS_PATH: Final = "/status"
# POST: the store host's launcher announces where its rendezvous store listens, signed
# with the job's key (runtime/launcher/announce.py).
STORE_PATH: Final = "/store"
# Each /status answer is signed (HMAC-SHA256, trainwave/signatures.py) with a
# key only the job's own workers hold: a per-job Secret the operator creates,
# mounted into every worker. The operator sends a fresh nonce with each request
# and the signature covers it, so an old answer cannot be replayed.
STATUS_SIGNATURE_HEADER: Final = "X-Trainwave-Signature"
STATUS_NONCE_HEADER: Final = "X-Trainwave-Nonce"
STATUS_KEY_VOLUME: Final = "trainwave-status-key"
STATUS_KEY_MOUNT_PATH: Final = "/etc/trainwave/status-key"
STATUS_KEY_FILE: Final = "key"
STATUS_KEY_PATH: Final = f"{STATUS_KEY_MOUNT_PATH}/{STATUS_KEY_FILE}"
ENV_STATUS_KEY_FILE: Final = "TRAINWAVE_STATUS_KEY_FILE"
# The operator's own master key (a Secret in its namespace) from which each
# job's key is derived, so the operator never has to read a job's Secret back.
DEFAULT_STATUS_KEY_SECRET: Final = "trainwave-status-key"

# Operator process defaults (the chart sets the same ports).
DEFAULT_METRICS_PORT: Final = 9090
DEFAULT_HEALTH_PORT: Final = 8080

# --- Dynamic Resource Allocation (resource.k8s.io/v1) for shared GPUs ------
# The node agent is the DRA driver of shared GPUs: it publishes one
# ResourceSlice per GPU (kube-scheduler v1.34.4 mis-packs several shareable
# devices in one slice, kubernetes/kubernetes#133705), each device shareable
# with its memory as consumable capacity; the kubelet side of the same driver
# prepares an allocated claim as a CDI device that pins the container to it.
DRA_DRIVER: Final = "gpu.trainwave.io"
DRA_DEVICE_CLASS: Final = "shared-gpu.trainwave.io"
DRA_DEVICE_PREFIX: Final = "gpu-"  # device name: gpu-<NVML index>
DRA_ATTRIBUTE_UUID: Final = "uuid"
DRA_ATTRIBUTE_INDEX: Final = "index"
DRA_ATTRIBUTE_PRODUCT: Final = "productName"
DRA_CAPACITY_MEMORY: Final = "memory"
DRA_CLAIM_REQUEST: Final = "gpu"  # the one request in a shared worker's claim
DRA_POD_CLAIM: Final = "shared-gpu"  # the pod's name for its claim
CDI_KIND: Final = "trainwave.io/gpu"  # CDI device id: trainwave.io/gpu=<device>

# --- Goodput, operator side (issue 26) ---------------------------------------
# On a Node where a straggler was named and its gang replaced (runPolicy.stragglers
# .replace): gangs are not placed there before this RFC 3339 time. An annotation,
# never a taint: other workloads may still use the node.
ANNOTATION_STRAGGLER_UNTIL: Final = "trainwave.io/straggler-until"
STRAGGLER_MARK_SECONDS: Final = 3600
