"""In-place restarts in the worker's env: torchrun's c10d rendezvous, only when asked for."""

from __future__ import annotations

from typing import Any

import pytest
from factories import make_body

from trainwave import contract
from trainwave.api.trainingjob import parse_trainingjob
from trainwave.builders.pods import build_worker_pods
from trainwave.builders.runtime import rendezvous_conf
from trainwave.builders.worker import Worker
from trainwave.resolving import resolve_job

pytestmark = pytest.mark.timeout(30)
IN_PLACE = {
    contract.ENV_PET_RDZV_BACKEND,
    contract.ENV_PET_RDZV_ENDPOINT,
    contract.ENV_PET_RDZV_ID,
    contract.ENV_PET_RDZV_CONF,
    contract.ENV_PET_MAX_RESTARTS,
    contract.ENV_PET_LOCAL_ADDR,
    contract.ENV_WORKER_ADDRESS,
    contract.ENV_POD_IP,
    contract.ENV_REPLACEMENT,
    contract.ENV_HANG_TIMEOUT_SECONDS,
}


def pods(
    runtime: dict[str, Any] | None,
    *,
    attempt: int = 0,
    hang: int | None = None,
    **options: Any,
) -> list[dict[str, Any]]:
    body = make_body("ddp", workers=2, runtime=runtime, command=["python", "t.py"], **options)
    if hang is not None:
        body["spec"]["runPolicy"]["hangTimeoutSeconds"] = hang
    return build_worker_pods(resolve_job(parse_trainingjob(body)), (0, 1), attempt=attempt)


def env(pod: dict[str, Any]) -> dict[str, str]:
    (worker,) = (c for c in pod["spec"]["containers"] if c["name"] == contract.WORKER_CONTAINER)
    return {e["name"]: e["value"] for e in worker["env"] if "value" in e}


def env_from(pod: dict[str, Any]) -> dict[str, Any]:
    (worker,) = (c for c in pod["spec"]["containers"] if c["name"] == contract.WORKER_CONTAINER)
    return {e["name"]: e["valueFrom"] for e in worker["env"] if "valueFrom" in e}


def ports(pod: dict[str, Any]) -> dict[str, int]:
    (worker,) = (c for c in pod["spec"]["containers"] if c["name"] == contract.WORKER_CONTAINER)
    return {p["name"]: p["containerPort"] for p in worker["ports"]}


def test_the_runtime_gives_every_worker_the_c10d_rendezvous_on_rank_0() -> None:
    rank0, rank1 = (env(p) for p in pods({}, attempt=2, hang=20))
    for found in (rank0, rank1):
        assert found[contract.ENV_PET_RDZV_BACKEND] == "c10d"
        # Attempt 2's Service: the names of a recreated gang are new (names.py).
        assert found[contract.ENV_PET_RDZV_ENDPOINT] == "ddp-worker-0.ddp-a2:29400"
        assert found[contract.ENV_PET_RDZV_ENDPOINT].split(":")[0] == found["MASTER_ADDR"]
        assert found[contract.ENV_PET_RDZV_ID] == "uid-1-a2"  # the job's uid and attempt
        assert found[contract.ENV_PET_MAX_RESTARTS] == "3"  # spec.runtime.inPlaceRestarts default
        assert found[contract.ENV_HANG_TIMEOUT_SECONDS] == "20"
    keep_alive = "keep_alive_interval=2,keep_alive_max_attempt=3"
    assert rank0[contract.ENV_PET_RDZV_CONF] == f"is_host=true,{keep_alive}"
    assert rank1[contract.ENV_PET_RDZV_CONF] == f"is_host=false,{keep_alive}"
    assert rank0[contract.ENV_PET_LOCAL_ADDR] == "ddp-worker-0.ddp-a2"
    assert rank1[contract.ENV_PET_LOCAL_ADDR] == "ddp-worker-1.ddp-a2"


def test_every_worker_can_name_the_others_and_the_store_host_knows_its_pod_ip() -> None:
    rank0, rank1 = pods({})
    for pod in (rank0, rank1):
        template = env(pod)[contract.ENV_WORKER_ADDRESS]
        assert [template.replace("{rank}", str(r)) for r in (0, 1)] == [
            env(rank0)[contract.ENV_PET_LOCAL_ADDR],
            env(rank1)[contract.ENV_PET_LOCAL_ADDR],
        ]
    # The downward API's pod IP, for rank 0 only: its agent names itself by it (launch.py).
    assert env_from(rank0) == {contract.ENV_POD_IP: {"fieldRef": {"fieldPath": "status.podIP"}}}
    assert env_from(rank1) == {}


def test_only_rank_0_declares_the_store_port() -> None:
    rank0, rank1 = pods({})
    assert ports(rank0)[contract.RDZV_PORT_NAME] == contract.DEFAULT_RDZV_PORT
    assert contract.RDZV_PORT_NAME not in ports(rank1)


@pytest.mark.parametrize(
    ("master_port", "status_port", "expected"),
    [
        pytest.param(29500, 29600, 29400, id="defaults"),
        pytest.param(29400, 29600, 29401, id="master-port-takes-29400"),
        pytest.param(29400, 29401, 29402, id="both-near"),
    ],
)
def test_the_store_port_never_collides_with_the_jobs_ports(
    master_port: int, status_port: int, expected: int
) -> None:
    rank0, _ = pods({"statusPort": status_port}, masterPort=master_port)
    assert env(rank0)[contract.ENV_PET_RDZV_ENDPOINT] == f"ddp-worker-0.ddp:{expected}"


@pytest.mark.parametrize(
    "runtime",
    [
        pytest.param(None, id="no-runtime"),
        pytest.param({"enabled": False}, id="runtime-disabled"),
        pytest.param({"inPlaceRestarts": 0}, id="in-place-off"),
    ],
)
def test_without_in_place_restarts_the_env_is_todays(runtime: dict[str, Any] | None) -> None:
    for pod in pods(runtime, hang=20):
        assert not IN_PLACE & (set(env(pod)) | set(env_from(pod)))
        assert contract.RDZV_PORT_NAME not in ports(pod)
        assert env(pod)[contract.ENV_PET_MASTER_ADDR] == "ddp-worker-0.ddp"  # static rendezvous


def test_the_hang_timeout_is_left_out_when_unset() -> None:
    rank0, _ = pods({"inPlaceRestarts": 5})
    assert env(rank0)[contract.ENV_PET_MAX_RESTARTS] == "5"
    assert contract.ENV_HANG_TIMEOUT_SECONDS not in env(rank0)


def test_users_may_not_set_the_new_names() -> None:
    assert set(contract.RESERVED_ENV) >= IN_PLACE


def test_a_worker_replaced_alone_skips_preflight_the_rest_of_its_gang_ran_it() -> None:
    # It joins a gang that trains already: its test would wait alone until its timeout.
    pending = {"replacements": {"pending": [{"rank": 1, "podUID": "u", "cause": "disruption",
                                             "since": "2026-11-27T19:00:00Z"}]}}  # fmt: skip
    body = make_body("ddp", workers=2, runtime={}, command=["python", "t.py"],
                     status_extra=pending)  # fmt: skip
    body["spec"]["runPolicy"]["preflight"] = {"enabled": True}
    rank0, rank1 = (env(p) for p in build_worker_pods(
        resolve_job(parse_trainingjob(body)), (0, 1), attempt=0))  # fmt: skip
    assert contract.ENV_PREFLIGHT_SIZE_MIB in rank0
    assert contract.ENV_PREFLIGHT_SIZE_MIB not in rank1
    # ...and it knows it replaces its worker (a worker 0 then announces its address).
    assert rank1[contract.ENV_REPLACEMENT] == "true"
    assert contract.ENV_REPLACEMENT not in rank0


@pytest.mark.parametrize(
    ("workers", "interval"), [(2, 2), (32, 2), (33, 3), (64, 4), (65, 5), (512, 5)]
)
def test_a_dead_node_leaves_the_rendezvous_sooner_than_torchs_15_s_and_heartbeats_scale(
    workers: int, interval: int
) -> None:
    worker = Worker(parse_trainingjob(make_body(workers=workers, runtime={})), 1, 0)
    assert rendezvous_conf(worker) == (
        f"is_host=false,keep_alive_interval={interval},keep_alive_max_attempt=3"
    )
    assert workers / interval <= 16 or interval == 5  # heartbeats a second on worker 0's store


def test_torchs_dynamic_rendezvous_reads_the_keep_alive_from_the_conf() -> None:
    """What the conf is for: torch's own parser (run.py splits PET_RDZV_CONF the same way)
    and handler factory take the keys; an unknown key would be silently ignored."""
    from torch.distributed import HashStore
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler
    from torch.distributed.elastic.rendezvous.utils import _parse_rendezvous_config

    worker = Worker(parse_trainingjob(make_body(workers=2, runtime={})), 1, 0)
    conf = _parse_rendezvous_config(rendezvous_conf(worker))
    params = RendezvousParameters("c10d", "ddp-worker-0.ddp:29400", "run", 2, 2, **conf)
    store = HashStore()
    handler = create_handler(store, C10dRendezvousBackend(store, "run"), params)
    settings = handler.settings
    assert settings.keep_alive_interval.total_seconds() == 2
    assert settings.keep_alive_max_attempt == 3
