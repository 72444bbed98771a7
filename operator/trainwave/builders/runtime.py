"""Runtime injection: the acceleration runtime, copied into the worker and wrapped around it. Pure.

An init container from the runtime image copies the pure-Python runtime into
an emptyDir; the worker container mounts it, finds it on PYTHONPATH, and runs
the user's command under the launcher, which applies the zero-code features,
serves the worker's status and exits with the command's exit code. The user's
image is not rebuilt and needs nothing but Python and torch. A downward-API
volume hands the launcher the pod's annotations: the env that depends on the
node (worker-env) only exists once the gang is placed. The job's status key
(a Secret the reconciler creates, builders/status_key.py) is mounted so the
launcher can sign its /status answers.

With `spec.runtime.inPlaceRestarts` > 0 the worker also gets torchrun's c10d
rendezvous (`in_place_env`): the launcher then runs every command under torch's
elastic agent, which restarts a failed gang inside the running pods.
"""

from typing import Any

from trainwave import contract
from trainwave.api.runtime import RuntimeSpec
from trainwave.builders.names import (
    master_address,
    status_key_secret,
    worker_address,
    worker_address_template,
)
from trainwave.builders.security import restricted_container
from trainwave.builders.worker import Worker


def set_runtime(pod: dict[str, Any], worker: Worker) -> None:
    runtime = worker.job.spec.runtime
    if runtime is None or not runtime.enabled:
        return
    spec = pod["spec"]
    container = next(c for c in spec["containers"] if c["name"] == contract.WORKER_CONTAINER)
    spec["volumes"] = [
        *(v for v in spec.get("volumes", []) if v.get("name") not in _VOLUMES),
        {"name": contract.RUNTIME_VOLUME, "emptyDir": {}},
        {
            "name": contract.PODINFO_VOLUME,
            "downwardAPI": {
                "items": [
                    {"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}}
                ]
            },
        },
        {
            "name": contract.STATUS_KEY_VOLUME,
            "secret": {
                "secretName": status_key_secret(worker.job.metadata.name, worker.job.metadata.uid),
                # The container's user may be anyone; the pod is the boundary.
                "defaultMode": 0o444,
                # A missing key must not keep training from starting: the launcher then
                # serves unsigned reports, which the operator ignores, and says so.
                "optional": True,
            },
        },
    ]
    spec["initContainers"] = [
        *(
            c
            for c in spec.get("initContainers", [])
            if c.get("name") != contract.RUNTIME_INIT_CONTAINER
        ),
        _installer(runtime, worker.runtime_image),
    ]
    container["volumeMounts"] = [
        *(m for m in container.get("volumeMounts", []) if m.get("name") not in _VOLUMES),
        {
            "name": contract.RUNTIME_VOLUME,
            "mountPath": contract.RUNTIME_MOUNT_PATH,
            "readOnly": True,
        },
        {
            "name": contract.PODINFO_VOLUME,
            "mountPath": contract.PODINFO_MOUNT_PATH,
            "readOnly": True,
        },
        {
            "name": contract.STATUS_KEY_VOLUME,
            "mountPath": contract.STATUS_KEY_MOUNT_PATH,
            "readOnly": True,
        },
    ]
    container["command"] = [
        runtime.python,
        "-m",
        contract.RUNTIME_LAUNCHER,
        "--",
        *container["command"],
    ]
    ours = (contract.STATUS_PORT_NAME, contract.RDZV_PORT_NAME)
    ports = [p for p in container.get("ports", []) if p.get("name") not in ours]
    ports.append({"name": contract.STATUS_PORT_NAME, "containerPort": runtime.status_port})
    in_place = in_place_env(worker)
    if in_place and worker.rank == 0:  # the c10d store lives in rank 0's agent
        ports.append({"name": contract.RDZV_PORT_NAME, "containerPort": rendezvous_port(worker)})
    container["ports"] = ports
    _add_env(container, {**runtime_env(runtime), **in_place, **preflight_env(worker)})
    if in_place and worker.rank == 0:  # its agent's address: launch.store_host_address
        pod_ip = {"fieldRef": {"fieldPath": "status.podIP"}}
        container["env"] = [
            *(e for e in container["env"] if e.get("name") != contract.ENV_POD_IP),
            {"name": contract.ENV_POD_IP, "valueFrom": pod_ip},
        ]


def preflight_env(worker: Worker) -> dict[str, str]:
    """runPolicy.preflight for the launcher (runtime/preflight.py); the thresholds stay
    with the operator, which judges the reports."""
    preflight = worker.job.spec.run_policy.preflight
    if not preflight.enabled or _replacing(worker):
        return {}
    return {
        contract.ENV_PREFLIGHT_SIZE_MIB: str(preflight.size_mib),
        contract.ENV_PREFLIGHT_TIMEOUT_SECONDS: str(preflight.timeout_seconds),
    }


def _replacing(worker: Worker) -> bool:
    """A worker recreated alone joins a gang that trains already: its test would wait alone
    for peers that tested at the attempt's start, until its timeout, before it could train."""
    replacements = worker.job.status.replacements
    return replacements is not None and any(p.rank == worker.rank for p in replacements.pending)


def runtime_env(runtime: RuntimeSpec) -> dict[str, str]:
    env = {
        contract.ENV_PODINFO_DIR: contract.PODINFO_MOUNT_PATH,
        contract.ENV_STATUS_PORT: str(runtime.status_port),
        contract.ENV_STATUS_KEY_FILE: contract.STATUS_KEY_PATH,
    }
    features = runtime.features.model_dump()
    for name in contract.RUNTIME_FEATURES:
        env[contract.ENV_FEATURE_PREFIX + name.upper()] = str(features[name])
    if runtime.checkpoint is not None:
        env[contract.ENV_CHECKPOINT_DIR] = runtime.checkpoint.path
        env[contract.ENV_CHECKPOINT_EVERY_STEPS] = str(runtime.checkpoint.every_steps)
        env[contract.ENV_CHECKPOINT_KEEP] = str(runtime.checkpoint.keep)
    if runtime.total_steps is not None:
        env[contract.ENV_TOTAL_STEPS] = str(runtime.total_steps)
    return env


def rendezvous_port(worker: Worker) -> int:
    """contract.DEFAULT_RDZV_PORT, or the next port the job does not use already."""
    spec = worker.job.spec
    taken = {spec.master_port, spec.runtime.status_port if spec.runtime else 0}
    port = contract.DEFAULT_RDZV_PORT
    while port in taken:
        port += 1
    return port


def in_place_env(worker: Worker) -> dict[str, str]:
    """torchrun's c10d rendezvous for in-place restarts; empty when they are off.

    Mirrors torch/distributed/elastic/rendezvous/c10d_rendezvous_backend.py
    (_create_tcp_store): the agent whose host matches the endpoint hosts the store,
    found by comparing hostnames and addresses, which fails while the headless
    Service's DNS record of rank 0 is not published yet; `is_host` says it
    outright. dynamic_rendezvous.py gives the process group's MASTER_ADDR as the
    group-rank-0 agent's local address (_NodeDesc.addr: --local-addr, else
    socket.getfqdn()), so each worker names itself the way MASTER_ADDR names rank 0
    (`<hostname>.<service>`, resolved by cluster DNS), not by whatever FQDN the
    image's resolver makes of the pod's hostname. Group ranks follow the sorted
    addresses (_mark_rendezvous_complete): the pod's rank up to 10 workers; beyond,
    torch orders `...-worker-10` before `...-worker-2`. When rank 0's pod dies the
    store dies with it: the other agents end, and their launchers start them again to meet
    the store of rank 0's replacement pod (runtime/launcher/rejoin.py).
    """
    runtime, meta = worker.job.spec.runtime, worker.job.metadata
    if runtime is None or not runtime.enabled or runtime.in_place_restarts <= 0:
        return {}
    master = master_address(meta.name, worker.attempt)
    env = {
        contract.ENV_PET_RDZV_BACKEND: contract.RDZV_BACKEND,
        contract.ENV_PET_RDZV_ENDPOINT: f"{master}:{rendezvous_port(worker)}",
        # A new attempt is a new gang: its agents must not join the old one's rounds.
        contract.ENV_PET_RDZV_ID: f"{meta.uid or meta.name}-a{worker.attempt}",
        contract.ENV_PET_RDZV_CONF: rendezvous_conf(worker),
        contract.ENV_PET_MAX_RESTARTS: str(runtime.in_place_restarts),
        contract.ENV_PET_LOCAL_ADDR: worker_address(meta.name, worker.rank, worker.attempt),
        contract.ENV_WORKER_ADDRESS: worker_address_template(meta.name, worker.attempt),
    }
    hang = worker.job.spec.run_policy.hang_timeout_seconds
    if hang is not None:
        env[contract.ENV_HANG_TIMEOUT_SECONDS] = str(hang)
    if _replacing(worker):
        env[contract.ENV_REPLACEMENT] = "true"
    return env


# Keep-alive of torch's dynamic rendezvous (dynamic_rendezvous.py `create_handler` reads
# keep_alive_interval and keep_alive_max_attempt from the rendezvous config; defaults 5 s
# and 3). A node that dies without leaving stays a participant until its last heartbeat is
# interval x attempts old (`_sanitize`), and the survivors' next round waits for it to go.
# An agent stopped by a signal does not leave (launcher/api.py `launch_agent`: no
# shutdown on SignalException), so with the defaults a replaced worker's gang waited 10-15 s
# after the eviction for its old node to be dropped, measured on the real node. Shorter
# here; every agent writes its heartbeat by compare-and-set of the whole state on worker 0's
# store, so the interval grows with the gang (torch's 5 s from 65 workers on): at most 16
# heartbeats a second up to 80 workers, torch's own rate beyond.
KEEP_ALIVE_ATTEMPTS = 3
KEEP_ALIVE_MIN_SECONDS, KEEP_ALIVE_MAX_SECONDS = 2, 5
WORKERS_PER_KEEP_ALIVE_SECOND = 16


def rendezvous_conf(worker: Worker) -> str:
    """PET_RDZV_CONF: `is_host` (worker 0 serves the store) and the keep-alive above."""
    workers = worker.job.spec.workers
    interval = -(-workers // WORKERS_PER_KEEP_ALIVE_SECOND)  # ceil
    interval = min(KEEP_ALIVE_MAX_SECONDS, max(KEEP_ALIVE_MIN_SECONDS, interval))
    host = "true" if worker.rank == 0 else "false"
    return (
        f"is_host={host},keep_alive_interval={interval},"
        f"keep_alive_max_attempt={KEEP_ALIVE_ATTEMPTS}"
    )


_VOLUMES = (contract.RUNTIME_VOLUME, contract.PODINFO_VOLUME, contract.STATUS_KEY_VOLUME)


def _installer(runtime: RuntimeSpec, default_image: str) -> dict[str, Any]:
    return {
        "name": contract.RUNTIME_INIT_CONTAINER,
        "image": runtime.image or default_image,
        "command": ["python", "-m", contract.RUNTIME_INSTALLER, contract.RUNTIME_MOUNT_PATH],
        "volumeMounts": [
            {"name": contract.RUNTIME_VOLUME, "mountPath": contract.RUNTIME_MOUNT_PATH}
        ],
        "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
        # Pod Security judges the whole pod: without this, any job with a runtime would be
        # refused in a namespace that enforces "restricted" (builders/security.py).
        "securityContext": restricted_container(),
    }


def _add_env(container: dict[str, Any], env: dict[str, str]) -> None:
    """Runtime defaults after the user's env; a user value for the same name wins.

    PYTHONPATH is the exception: the runtime directory is put in front of
    whatever the user set, or the launcher could not be imported.
    """
    current = container.get("env", [])
    present = {e.get("name") for e in current}
    user_path = next((e for e in current if e.get("name") == "PYTHONPATH"), None)
    path = contract.RUNTIME_MOUNT_PATH
    if user_path is not None and "value" in user_path:
        user_path["value"] = f"{path}:{user_path['value']}" if user_path["value"] else path
    elif user_path is None:
        current = [*current, {"name": "PYTHONPATH", "value": path}]
    container["env"] = [
        *current,
        *({"name": k, "value": v} for k, v in env.items() if k not in present),
    ]
