"""TRAINWAVE_* parsing: defaults, accepted values, and errors that name variable, value and choices."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from trainwave import contract
from trainwave.runtime.settings import DEFAULT_REPORT_DIR, Settings, SettingsError, load_settings


def test_defaults_when_nothing_is_set() -> None:
    settings = load_settings({})
    assert {settings.feature(name) for name in contract.RUNTIME_FEATURES} == {"auto"}
    assert settings.status_port == contract.DEFAULT_STATUS_PORT
    assert settings.report_dir == DEFAULT_REPORT_DIR
    assert settings.checkpoint_dir is None
    assert settings.identity.world_size == 1


GOOD = {
    "feature-off": ({"TRAINWAVE_FEATURE_AMP": "off"}, lambda s: s.feature("amp") == "off"),
    "feature-upper-case": ({"TRAINWAVE_FEATURE_TF32": " ON "}, lambda s: s.feature("tf32") == "on"),
    "compression-powersgd": ({"TRAINWAVE_FEATURE_COMPRESSION": "powersgd"}, lambda s: s.feature("compression") == "powersgd"),
    "compression-on-means-auto": ({"TRAINWAVE_FEATURE_COMPRESSION": "on"}, lambda s: s.feature("compression") == "auto"),
    "checkpoint": ({"TRAINWAVE_CHECKPOINT_DIR": "/ckpt", "TRAINWAVE_CHECKPOINT_EVERY_STEPS": "500", "TRAINWAVE_CHECKPOINT_KEEP": "2"},
                   lambda s: (s.checkpoint_dir, s.checkpoint_every_steps, s.checkpoint_keep) == (Path("/ckpt"), 500, 2)),
    "status-port-any": ({"TRAINWAVE_STATUS_PORT": "0", "TRAINWAVE_STATUS_HOST": "127.0.0.1"}, lambda s: (s.status_host, s.status_port) == ("127.0.0.1", 0)),
    "topology-hints": ({"TRAINWAVE_INTER_NODE_GBPS": "200", "TRAINWAVE_INTRA_NODE_GBPS": "900.5"}, lambda s: (s.inter_node_gbps, s.intra_node_gbps) == (200.0, 900.5)),
    "identity": ({"RANK": "9", "WORLD_SIZE": "16", "LOCAL_RANK": "1", "PET_NPROC_PER_NODE": "8", "TRAINWAVE_JOB_NAME": "llama"},
                 lambda s: (s.identity.rank, s.identity.world_size, s.identity.local_rank, s.identity.nproc_per_node, s.identity.job_name) == (9, 16, 1, 8, "llama")),
    "loader-flags": ({"TRAINWAVE_LOADER_PIN_MEMORY": "false", "TRAINWAVE_LOADER_NUM_WORKERS": "0"}, lambda s: (s.loader.pin_memory, s.loader.num_workers) == (False, 0)),
    "empty-is-unset": ({"TRAINWAVE_CHECKPOINT_EVERY_STEPS": "", "TRAINWAVE_STATUS_PORT": " "}, lambda s: (s.checkpoint_every_steps, s.status_port) == (None, contract.DEFAULT_STATUS_PORT)),
    "telemetry-every-update": ({"TRAINWAVE_TELEMETRY_INTERVAL_SECONDS": "0"}, lambda s: s.telemetry_interval_seconds == 0.0),
}  # fmt: skip


@pytest.mark.parametrize(("environ", "holds"), GOOD.values(), ids=GOOD.keys())
def test_accepted(environ: dict[str, str], holds: Callable[[Settings], bool]) -> None:
    assert holds(load_settings(environ))


BAD = {
    "feature-mode": ({"TRAINWAVE_FEATURE_AMP": "maybe"}, ["TRAINWAVE_FEATURE_AMP", "'maybe'", "on, off, auto"]),
    "compression-algorithm": ({"TRAINWAVE_FEATURE_COMPRESSION": "int8"}, ["TRAINWAVE_FEATURE_COMPRESSION", "'int8'", "fp16, bf16, powersgd"]),
    "misspelt-feature": ({"TRAINWAVE_FEATURE_AMPP": "on"}, ["TRAINWAVE_FEATURE_AMPP", "unknown feature", "TRAINWAVE_FEATURE_AMP"]),
    "not-a-number": ({"TRAINWAVE_CHECKPOINT_EVERY_STEPS": "ten"}, ["TRAINWAVE_CHECKPOINT_EVERY_STEPS", "'ten'", "integer >= 1"]),
    "zero-steps": ({"TRAINWAVE_CHECKPOINT_EVERY_STEPS": "0"}, ["'0'", "integer >= 1"]),
    "port-range": ({"TRAINWAVE_STATUS_PORT": "70000"}, ["TRAINWAVE_STATUS_PORT", "70000", "0-65535"]),
    "negative-bandwidth": ({"TRAINWAVE_INTER_NODE_GBPS": "-5"}, ["TRAINWAVE_INTER_NODE_GBPS", "'-5'", "> 0"]),
    "nan-bandwidth": ({"TRAINWAVE_INTER_NODE_GBPS": "nan"}, ["'nan'", "> 0"]),
    "bad-flag": ({"TRAINWAVE_LOADER_PIN_MEMORY": "sometimes"}, ["TRAINWAVE_LOADER_PIN_MEMORY", "'sometimes'", "true"]),
    "negative-rank": ({"RANK": "-1"}, ["RANK", "'-1'", ">= 0"]),
}  # fmt: skip


@pytest.mark.parametrize(("environ", "message_has"), BAD.values(), ids=BAD.keys())
def test_rejected_with_variable_value_and_choices(
    environ: dict[str, str], message_has: list[str]
) -> None:
    with pytest.raises(SettingsError) as error:
        load_settings(environ)
    for text in message_has:
        assert text in str(error.value)


def test_unknown_feature_name_is_a_key_error() -> None:
    with pytest.raises(KeyError, match="known: tf32"):
        load_settings({}).feature("turbo")


def test_as_dict_lists_every_feature() -> None:
    view = load_settings({"TRAINWAVE_FEATURE_DOCTOR": "on"}).as_dict()
    assert view["features"]["doctor"] == "on"
    assert set(view["features"]) == set(contract.RUNTIME_FEATURES)


@pytest.mark.parametrize(
    ("environ", "enabled", "restarts", "hang", "reason"),
    [
        pytest.param({}, False, 0, None, "no PET_RDZV_BACKEND", id="older-operator-or-off"),
        pytest.param(
            {"PET_RDZV_BACKEND": "c10d", "PET_MAX_RESTARTS": "3",
             "TRAINWAVE_HANG_TIMEOUT_SECONDS": "20"},
            True, 3, 20.0, "", id="on",
        ),
        pytest.param(
            {"PET_RDZV_BACKEND": "static", "PET_MAX_RESTARTS": "3"},
            False, 0, None, "is 'static'", id="static-rendezvous",
        ),
        pytest.param(
            {"PET_RDZV_BACKEND": "c10d", "PET_MAX_RESTARTS": "0"},
            False, 0, None, "PET_MAX_RESTARTS is 0", id="no-restarts",
        ),
    ],
)  # fmt: skip
def test_in_place_restarts(
    environ: dict[str, str], enabled: bool, restarts: int, hang: float | None, reason: str
) -> None:
    in_place = load_settings(environ).in_place
    assert (in_place.enabled, in_place.max_restarts, in_place.hang_timeout_seconds) == (
        enabled,
        restarts,
        hang,
    )
    assert reason in in_place.reason


@pytest.mark.parametrize(
    ("conf", "hosts"),
    [("is_host=true", True), ("is_host=false", False), ("read_timeout=60, is_host=True", True),
     ("", False), ("is_host", False)],
)  # fmt: skip
def test_the_store_host_is_read_from_the_rendezvous_conf(conf: str, hosts: bool) -> None:
    environ = {"PET_RDZV_BACKEND": "c10d", "PET_MAX_RESTARTS": "3", "PET_RDZV_CONF": conf}
    assert load_settings(environ).in_place.hosts_store is hosts


def test_a_bad_hang_timeout_is_refused_naming_it() -> None:
    with pytest.raises(SettingsError, match="TRAINWAVE_HANG_TIMEOUT_SECONDS='soon'"):
        load_settings({"TRAINWAVE_HANG_TIMEOUT_SECONDS": "soon"})


@pytest.mark.parametrize(
    ("nnodes", "rank", "peers"),
    [("3", "1", ("j-worker-0.j", "j-worker-2.j")), ("1:3", "0", ("j-worker-1.j", "j-worker-2.j")),
     ("1", "0", ())],
)  # fmt: skip
def test_the_other_workers_addresses_come_from_the_template(
    nnodes: str, rank: str, peers: tuple[str, ...]
) -> None:
    environ = {"PET_RDZV_BACKEND": "c10d", "PET_MAX_RESTARTS": "3", "PET_NNODES": nnodes,
               "NODE_RANK": rank, "TRAINWAVE_WORKER_ADDRESS": "j-worker-{rank}.j"}  # fmt: skip
    assert load_settings(environ).in_place.peers == peers


@pytest.mark.parametrize(
    ("variable", "value", "named"),
    [("TRAINWAVE_WORKER_ADDRESS", "j-worker-0.j", "TRAINWAVE_WORKER_ADDRESS='j-worker-0.j'"),
     ("PET_NNODES", "two", "PET_NNODES='two'")],
)  # fmt: skip
def test_a_bad_worker_address_template_is_refused_naming_it(
    variable: str, value: str, named: str
) -> None:
    environ = {"PET_RDZV_BACKEND": "c10d", "PET_MAX_RESTARTS": "3", "PET_NNODES": "2",
               "TRAINWAVE_WORKER_ADDRESS": "j-worker-{rank}.j", variable: value}  # fmt: skip
    with pytest.raises(SettingsError, match=re.escape(named)):
        load_settings(environ)
