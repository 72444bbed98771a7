"""Chart tests of the operator's Deployment: arguments, leader election, replicas and
rollout, PodDisruptionBudget, image, probes, metrics port, security context, resources
and pod scheduling values (chart_render.py renders).
"""

from __future__ import annotations

import pytest
from chart_render import (
    NAMESPACE,
    RELEASE,
    container,
    find,
    named,
    one,
    pod_spec,
    render,
    render_error,
)

pytestmark = pytest.mark.timeout(20)

# --- the operator Deployment ----------------------------------------------------------------

DEFAULT_ARGS = [
    "operator",
    "--metrics-port", "9090",
    "--health-port", "8080",
    "--log-level", "info",
    "--workers", "8",
    "--topology-levels", "trainwave.io/spine,trainwave.io/rack,kubernetes.io/hostname",
    "--runtime-image", "trainwave/runtime:0.1.0",
    "--status-key-secret", f"{NAMESPACE}/{RELEASE}-trainwave-status-key",
    "--status-interval-seconds", "15",
    "--queue-max-skips", "4",
]  # fmt: skip


def default_args_with(values: dict[str, str]) -> list[str]:
    """DEFAULT_ARGS with the value after each flag in `values` replaced, in place."""
    args = list(DEFAULT_ARGS)
    for flag, value in values.items():
        args[args.index(flag) + 1] = value
    return args


# The agent's arbiter is on by default: shared workers mount its sockets.
ARBITER_ARGS = ["--arbiter-dir", "/run/trainwave/arbiter"]
LEADER_ARGS = [
    "--leader-elect-resource-name", "tw-trainwave-leader",
    "--leader-elect-lease-duration", "15",
    "--leader-elect-renew-deadline", "10",
    "--leader-elect-retry-period", "2",
]  # fmt: skip


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        pytest.param((), DEFAULT_ARGS, id="defaults-cluster-wide"),
        pytest.param(
            ("--set-json", 'watchNamespaces=["team-a","team-b"]'),
            [*DEFAULT_ARGS, "--namespace", "team-a", "--namespace", "team-b"],
            id="watch-namespaces",
        ),
        pytest.param(
            ("--set", "logLevel=debug", "--set", "metrics.port=9100", "--set", "health.port=8081"),
            default_args_with({"--metrics-port": "9100", "--health-port": "8081",
                               "--log-level": "debug"}),
            id="ports-and-log-level",
        ),
        pytest.param(
            ("--set", "reconcileWorkers=16"),
            default_args_with({"--workers": "16"}),
            id="reconcile-workers",
        ),
        pytest.param(
            ("--set-json", 'topology.levels=["rack","kubernetes.io/hostname"]'),
            default_args_with({"--topology-levels": "rack,kubernetes.io/hostname"}),
            id="topology-levels",
        ),
        pytest.param(
            ("--set", "runtime.image=mirror.example/trainwave/runtime:0.1.0"),
            default_args_with({"--runtime-image": "mirror.example/trainwave/runtime:0.1.0"}),
            id="runtime-image",
        ),
        pytest.param(
            ("--set", "runtime.statusIntervalSeconds=2"),
            default_args_with({"--status-interval-seconds": "2"}),
            id="status-interval",
        ),
        pytest.param(
            ("--set", "queue.maxSkips=0"),
            default_args_with({"--queue-max-skips": "0"}),
            id="queue-max-skips",
        ),
    ],
)  # fmt: skip
def test_operator_args(args: tuple[str, ...], expected: list[str]) -> None:
    assert container(render(*args))["args"] == [*expected, *LEADER_ARGS, *ARBITER_ARGS]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        pytest.param(
            ("--set", "leaderElection.leaseDuration=30", "--set", "leaderElection.retryPeriod=3"),
            ["--leader-elect-resource-name", "tw-trainwave-leader",
             "--leader-elect-lease-duration", "30", "--leader-elect-renew-deadline", "10",
             "--leader-elect-retry-period", "3"],
            id="timing",
        ),
        pytest.param(
            ("--set", "replicas=1", "--set", "leaderElection.enabled=false"),
            ["--no-leader-elect"],
            id="disabled",
        ),
    ],
)  # fmt: skip
def test_leader_election_args(args: tuple[str, ...], expected: list[str]) -> None:
    assert container(render(*args))["args"] == [*DEFAULT_ARGS, *expected, *ARBITER_ARGS]


def test_two_replicas_roll_one_at_a_time() -> None:
    # The Lease lets old and new pods overlap; maxUnavailable 0 keeps a standby up.
    spec = one(render(), "Deployment")["spec"]
    assert spec["replicas"] == 2
    assert spec["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }


def test_without_leader_election_one_replica_is_replaced_not_rolled() -> None:
    spec = one(render("--set", "replicas=1", "--set", "leaderElection.enabled=false"), "Deployment")
    assert spec["spec"]["replicas"] == 1
    assert spec["spec"]["strategy"] == {"type": "Recreate"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(("--set", "leaderElection.enabled=false"), "replicas > 1 needs",
                     id="replicas-without-election"),
        pytest.param(("--set", "leaderElection.leaseDuration=10"), "leaseDuration must be",
                     id="lease-not-above-deadline"),
        pytest.param(("--set", "leaderElection.retryPeriod=9"), "1.2 x", id="retry-too-long"),
    ],
)  # fmt: skip
def test_unsafe_election_settings_fail_at_install(args: tuple[str, ...], message: str) -> None:
    assert message in render_error(*args)


def test_pod_name_comes_from_the_downward_api() -> None:
    env = {item["name"]: item for item in container(render())["env"]}
    assert env["POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}


def test_leader_election_role_names_only_its_lease() -> None:
    manifests = render()
    role = named(manifests, "Role", "tw-trainwave-leader")
    assert role["metadata"]["namespace"] == NAMESPACE
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": ["tw-trainwave-leader"],
            "verbs": ["get", "update"],
        },
    ]
    binding = named(manifests, "RoleBinding", role["metadata"]["name"])
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "tw-trainwave", "namespace": NAMESPACE}
    ]


def test_no_lease_role_without_leader_election() -> None:
    manifests = render("--set", "replicas=1", "--set", "leaderElection.enabled=false")
    assert [r["metadata"]["name"] for r in find(manifests, "Role")] == [
        f"{RELEASE}-trainwave-status-key"
    ]


@pytest.mark.parametrize(
    ("args", "min_available"),
    [
        pytest.param((), 1, id="default"),
        pytest.param(("--set", "replicas=3", "--set", "podDisruptionBudget.minAvailable=2"), 2,
                     id="three-replicas"),
        pytest.param(("--set", "replicas=1"), None, id="one-replica-no-pdb"),
        pytest.param(("--set", "podDisruptionBudget.enabled=false"), None, id="disabled"),
    ],
)  # fmt: skip
def test_pod_disruption_budget(args: tuple[str, ...], min_available: int | None) -> None:
    manifests = render(*args)
    budgets = find(manifests, "PodDisruptionBudget")
    if min_available is None:
        assert budgets == []
        return
    (budget,) = budgets
    selector = one(manifests, "Deployment")["spec"]["selector"]
    assert budget["spec"] == {"minAvailable": min_available, "selector": selector}


@pytest.mark.parametrize(
    ("args", "image"),
    [
        pytest.param((), "trainwave/operator:0.1.0", id="app-version"),
        pytest.param(
            ("--set", "image.repository=mirror.local/tw", "--set", "image.tag=dev"),
            "mirror.local/tw:dev",
            id="override",
        ),
    ],
)
def test_image(args: tuple[str, ...], image: str) -> None:
    assert container(render(*args))["image"] == image


def test_pod_namespace_comes_from_the_downward_api() -> None:
    env = {item["name"]: item for item in container(render())["env"]}
    assert env["POD_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}


@pytest.mark.parametrize("port", [8080, 8181], ids=["default", "custom"])
def test_probes_hit_healthz_on_the_health_port(port: int) -> None:
    operator = container(render("--set", f"health.port={port}"))
    ports = {item["name"]: item["containerPort"] for item in operator["ports"]}
    assert ports["health"] == port
    for probe in ("livenessProbe", "readinessProbe"):
        assert operator[probe]["httpGet"] == {"path": "/healthz", "port": "health"}


@pytest.mark.parametrize("port", [9090, 9100], ids=["default", "custom"])
def test_metrics_port(port: int) -> None:
    manifests = render("--set", f"metrics.port={port}")
    ports = {item["name"]: item["containerPort"] for item in container(manifests)["ports"]}
    assert ports["metrics"] == port
    service = one(manifests, "Service")
    assert service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": port, "targetPort": "metrics", "protocol": "TCP"}
    ]


def test_metrics_service_can_be_disabled() -> None:
    assert not find(render("--set", "metrics.service.enabled=false"), "Service")


def test_security_context_is_hardened() -> None:
    manifests = render()
    pod = pod_spec(manifests)["securityContext"]
    assert pod["runAsNonRoot"] is True
    assert pod["runAsUser"] == 65532
    assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
    operator = container(manifests)["securityContext"]
    assert operator["readOnlyRootFilesystem"] is True
    assert operator["allowPrivilegeEscalation"] is False
    assert operator["capabilities"] == {"drop": ["ALL"]}
    # A read-only root still needs somewhere for temporary files.
    assert {"name": "tmp", "mountPath": "/tmp"} in container(manifests)["volumeMounts"]


def test_resources_default() -> None:
    assert container(render())["resources"] == {
        "requests": {"cpu": "100m", "memory": "128Mi"},
        "limits": {"memory": "512Mi"},
    }


@pytest.mark.parametrize(
    ("args", "field", "value"),
    [
        pytest.param(
            ("--set", "nodeSelector.pool=system"),
            "nodeSelector",
            {"pool": "system"},
            id="nodeSelector",
        ),
        pytest.param(
            ("--set-json", 'tolerations=[{"key":"system","operator":"Exists"}]'),
            "tolerations",
            [{"key": "system", "operator": "Exists"}],
            id="tolerations",
        ),
        pytest.param(
            ("--set", "priorityClassName=system-cluster-critical"),
            "priorityClassName",
            "system-cluster-critical",
            id="priorityClassName",
        ),
        pytest.param(
            ("--set-json", 'imagePullSecrets=[{"name":"regcred"}]'),
            "imagePullSecrets",
            [{"name": "regcred"}],
            id="imagePullSecrets",
        ),
    ],
)
def test_pod_scheduling_values_pass_through(
    args: tuple[str, ...], field: str, value: object
) -> None:
    assert field not in pod_spec(render())
    assert pod_spec(render(*args))[field] == value


def test_pod_annotations() -> None:
    template = one(render("--set", "podAnnotations.a=b"), "Deployment")["spec"]["template"]
    assert template["metadata"]["annotations"] == {"a": "b"}
