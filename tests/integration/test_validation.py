"""Bad input: the API server refuses what the schema and CEL express; the operator
fails the rest with reason InvalidSpec and keeps working."""

import copy

import pytest
import yaml

from integration.trainwave_fixtures import apply, job_manifest, wait_for_phase

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(120),
    pytest.mark.usefixtures("trainwave_installed"),
]


def _with(path: str, value, base=None):
    manifest = copy.deepcopy(base or job_manifest("bad"))
    *parents, leaf = path.split(".")
    node = manifest
    for key in parents:
        node = node.setdefault(key, {})
    if value is _DELETE:
        node.pop(leaf)
    else:
        node[leaf] = value
    return manifest


_DELETE = object()

REJECTED = [
    ("zero-workers", _with("spec.workers", 0), ["spec.workers", "greater than or equal to 1"]),
    ("negative-gpus", _with("spec.gpusPerWorker", -1), ["spec.gpusPerWorker", "greater than or equal to 0"]),
    ("unknown-field", _with("spec.wrokers", 2), ['unknown field "spec.wrokers"']),
    ("missing-image", _with("spec.image", _DELETE), ["spec.image", "Required value"]),
    ("empty-image", _with("spec.image", ""), ["spec.image"]),
    (
        "failure-rule-unknown-action",
        _with("spec.runPolicy", {"failurePolicy": {"rules": [
            {"action": "Retry", "onExitCodes": {"operator": "In", "values": [1]}}]}}),
        ["spec.runPolicy.failurePolicy.rules[0].action", "RestartGang"],
    ),
    (
        "failure-rule-zero-exit-code",
        _with("spec.runPolicy", {"failurePolicy": {"rules": [
            {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [0]}}]}}),
        ["onExitCodes.values must not contain 0"],
    ),
    (
        "failure-rule-without-a-matcher",
        _with("spec.runPolicy", {"failurePolicy": {"rules": [{"action": "FailJob"}]}}),
        [
            "spec.runPolicy.failurePolicy.rules[0]",
            "exactly one of onExitCodes, onPodConditions, onReasons",
        ],
    ),
    (
        "reserved-env",
        _with("spec.env", [{"name": "WORLD_SIZE", "value": "3"}]),
        ["spec.env must not set a name trainwave reserves"],
    ),
    ("bad-quantity", _with("spec.resources", {"requests": {"cpu": "lots"}}), ["spec.resources.requests.cpu"]),
    (
        "name-too-long",
        _with("metadata.name", "x" * 52),
        ["metadata.name must be at most 51 characters"],
    ),
]  # fmt: skip


@pytest.mark.parametrize(("manifest", "expected"), [(m, e) for _, m, e in REJECTED],
                         ids=[i for i, _, _ in REJECTED])  # fmt: skip
def test_api_server_rejects_invalid_manifests_naming_the_field(
    cluster, namespace, manifest, expected
):
    result = cluster.kubectl(
        "apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(manifest), check=False
    )
    assert result.returncode != 0, f"accepted: {result.stdout}"
    for fragment in expected:
        assert fragment in result.stderr


@pytest.mark.parametrize(
    "field",
    [
        ("workers", 3),
        ("image", "other:2"),
        ("gpusPerWorker", 2),
        ("env", [{"name": "A", "value": "b"}]),
    ],
    ids=lambda f: f[0],
)
def test_pod_shaping_fields_are_immutable_unless_suspended(cluster, namespace, field):
    apply(cluster, namespace, job_manifest("fixed", result=None))
    name, value = field
    patch = yaml.safe_dump({"spec": {name: value}})
    result = cluster.kubectl(
        "patch", "tj", "fixed", "-n", namespace, "--type=merge", "-p", patch, check=False
    )
    assert result.returncode != 0
    assert f"spec.{name} is immutable while the job is not suspended" in result.stderr


@pytest.mark.parametrize(
    ("template_spec", "message"),
    [
        ({"restartPolicy": "Always"}, "spec.template.spec.restartPolicy is 'Always'"),
        ({"hostname": "mine"}, "spec.template.spec.hostname must not be set"),
        ({"containers": [{"name": "worker", "env": [{"name": "RANK", "value": "0"}]}]},
         "spec.template.spec.containers[worker].env sets RANK"),
        # Only the API server knows this pod is invalid: the mount names no volume.
        ({"containers": [{"name": "worker", "volumeMounts": [{"name": "nope", "mountPath": "/data"}]}]},
         "pod rejected"),
    ],
    ids=["restart-policy", "hostname", "reserved-env-in-template", "rejected-by-api-server"],
)  # fmt: skip
def test_semantic_errors_fail_the_job_with_invalid_spec(
    cluster, namespace, running_operator, template_spec, message
):
    apply(cluster, namespace, job_manifest("semantic", template_spec=template_spec))
    failed = wait_for_phase(cluster, namespace, "semantic", "Failed")
    assert failed["status"]["reason"] == "InvalidSpec"
    assert message in failed["status"]["message"]
    # The operator is still alive and still runs good jobs.
    apply(cluster, namespace, job_manifest("fine"))
    wait_for_phase(cluster, namespace, "fine", "Succeeded")
    assert running_operator.alive()
