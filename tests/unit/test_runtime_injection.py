"""Runtime injection: the init container, the launcher around the command, and the env."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from factories import make_body, make_job

from trainwave import contract
from trainwave.api.trainingjob import InvalidSpec
from trainwave.builders.pods import build_worker_pods
from trainwave.builders.status_key import build_status_key_secret
from trainwave.resolving import check_template, resolve, resolve_job
from trainwave.runtime.install import install

pytestmark = pytest.mark.timeout(30)


def pod_for(runtime: dict[str, Any] | None, **options: Any) -> dict[str, Any]:
    options.setdefault("command", ["torchrun", "train.py"])
    job = make_job(workers=1, runtime=runtime, **options)
    check_template(job)  # the reconciler's boundary check, once per job
    [pod] = build_worker_pods(resolve_job(job), (0,), attempt=0, runtime_image="example/runtime:1")
    return pod


def worker(pod: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in pod["spec"]["containers"] if c["name"] == contract.WORKER_CONTAINER)


def env(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in worker(pod)["env"] if "value" in e}


def test_the_command_runs_under_the_launcher_and_args_stay_args() -> None:
    pod = pod_for({}, args=["--epochs", "3"])
    assert worker(pod)["command"] == [
        "python", "-m", "trainwave.runtime.launch", "--", "torchrun", "train.py",
    ]  # fmt: skip
    assert worker(pod)["args"] == ["--epochs", "3"]


def test_an_init_container_copies_the_runtime_into_a_volume_the_worker_reads() -> None:
    pod = pod_for({})
    [init] = pod["spec"]["initContainers"]
    assert init["name"] == contract.RUNTIME_INIT_CONTAINER
    assert init["image"] == "example/runtime:1"
    assert init["command"][-1] == contract.RUNTIME_MOUNT_PATH
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes[contract.RUNTIME_VOLUME] == {"name": contract.RUNTIME_VOLUME, "emptyDir": {}}
    items = volumes[contract.PODINFO_VOLUME]["downwardAPI"]["items"]
    assert items == [{"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}}]
    mounts = {m["mountPath"]: m for m in worker(pod)["volumeMounts"]}
    assert mounts[contract.RUNTIME_MOUNT_PATH]["readOnly"] is True
    assert contract.PODINFO_MOUNT_PATH in mounts
    assert {"name": contract.STATUS_PORT_NAME, "containerPort": 29600} in worker(pod)["ports"]


def test_features_checkpoint_and_steps_become_env() -> None:
    runtime = {
        "features": {"compression": "powersgd", "amp": "off"},
        "checkpoint": {"path": "/ckpt", "everySteps": 50},
        "totalSteps": 1000,
        "image": "own/runtime:2",
    }
    pod = pod_for(runtime)
    found = env(pod)
    assert found["TRAINWAVE_FEATURE_COMPRESSION"] == "powersgd"
    assert found["TRAINWAVE_FEATURE_AMP"] == "off"
    assert found["TRAINWAVE_FEATURE_TF32"] == "auto"
    assert {k for k in found if k.startswith("TRAINWAVE_FEATURE_")} == {
        contract.ENV_FEATURE_PREFIX + name.upper() for name in contract.RUNTIME_FEATURES
    }
    assert found[contract.ENV_CHECKPOINT_DIR] == "/ckpt"
    assert found[contract.ENV_CHECKPOINT_EVERY_STEPS] == "50"
    assert found[contract.ENV_TOTAL_STEPS] == "1000"
    assert found[contract.ENV_PODINFO_DIR] == contract.PODINFO_MOUNT_PATH
    assert found["PYTHONPATH"] == contract.RUNTIME_MOUNT_PATH
    assert pod["spec"]["initContainers"][0]["image"] == "own/runtime:2"


def test_user_env_wins_and_their_pythonpath_comes_after_the_runtime() -> None:
    pod = pod_for({}, env=(("PYTHONPATH", "/app"), ("TRAINWAVE_FEATURE_AMP", "on")))
    assert env(pod)["PYTHONPATH"] == f"{contract.RUNTIME_MOUNT_PATH}:/app"
    values = [e["value"] for e in worker(pod)["env"] if e["name"] == "TRAINWAVE_FEATURE_AMP"]
    assert values == ["on"]


def test_disabled_or_absent_runtime_changes_nothing() -> None:
    for runtime in (None, {"enabled": False}):
        pod = pod_for(runtime)
        assert "initContainers" not in pod["spec"]
        assert worker(pod)["command"] == ["torchrun", "train.py"]


def test_a_runtime_without_a_command_is_refused_naming_the_field() -> None:
    with pytest.raises(InvalidSpec, match=r"spec\.command must be set"):
        pod_for({}, command=[])


def test_install_copies_a_runtime_that_imports_without_the_operator(tmp_path: Path) -> None:
    installed = install(tmp_path / "opt")
    assert (installed / "runtime" / "launch.py").is_file()
    assert not (installed / "controller").exists()
    install(tmp_path / "opt")  # idempotent
    assert (installed / "signatures.py").is_file()  # the launcher signs its /status with it
    assert (installed / "hardware" / "gpudirect.py").is_file()  # the doctor's shared checks
    probe = (
        "import sys, trainwave.runtime.settings as s, trainwave.runtime.launch, "
        "trainwave.runtime.doctor.checklist; "
        "assert 'kopf' not in sys.modules and 'kubernetes' not in sys.modules; print(s.__file__)"
    )
    result = subprocess.run(
        [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(tmp_path / 'opt')!r}); {probe}"],
        capture_output=True, text=True, check=True, timeout=20,
    )  # fmt: skip
    assert result.stdout.strip().startswith(str(tmp_path / "opt"))


def test_the_jobs_status_key_secret_is_mounted_read_only_and_named_in_the_env() -> None:
    pod = pod_for({})
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    secret = volumes[contract.STATUS_KEY_VOLUME]["secret"]
    job = make_job(workers=1, runtime={}, command=["torchrun", "train.py"])
    assert secret["secretName"] == f"demo-status-key-{job.metadata.uid[:8]}"
    assert secret["optional"] is True  # a missing key must not keep training from starting
    mounts = {m["mountPath"]: m for m in worker(pod)["volumeMounts"]}
    assert mounts[contract.STATUS_KEY_MOUNT_PATH]["readOnly"] is True
    assert env(pod)[contract.ENV_STATUS_KEY_FILE] == contract.STATUS_KEY_PATH


def test_the_status_key_secret_is_owned_by_its_job_and_never_changes() -> None:
    job = make_job()
    secret = build_status_key_secret(job.metadata, b"k" * 32)
    assert secret["metadata"]["name"] == f"{job.metadata.name}-status-key-{job.metadata.uid[:8]}"
    assert secret["metadata"]["ownerReferences"][0]["uid"] == job.metadata.uid
    assert secret["immutable"] is True
    assert secret["stringData"] == {contract.STATUS_KEY_FILE: (b"k" * 32).hex()}


def test_a_volume_of_the_wrong_type_is_refused_before_any_builder_runs() -> None:
    # Issue 10: the runtime mutator used to raise on it, and the reconcile retried forever.
    body = make_body(template={"spec": {"volumes": ["oops"]}}, runtime={}, command=["python"])
    with pytest.raises(InvalidSpec) as raised:
        resolve(body)
    assert str(raised.value) == "spec.template.spec.volumes[0] must be an object (got 'oops')"


def test_nulls_in_the_template_are_unset_fields_as_the_api_server_stores_them() -> None:
    template = {"spec": {"volumes": None, "containers": [{"name": "worker", "ports": None}]}}
    resolved = resolve(make_body(template=template, runtime={}, command=["python"]))
    (pod,) = build_worker_pods(resolved, (0,), 0)
    assert [v["name"] for v in pod["spec"]["volumes"]] == [
        contract.RUNTIME_VOLUME,
        contract.PODINFO_VOLUME,
        contract.STATUS_KEY_VOLUME,
    ]
