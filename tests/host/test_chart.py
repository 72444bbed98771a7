"""Chart tests: render charts/trainwave with `helm template` and assert on the manifests.

The style of cert-manager's helm-unittest suites (one behaviour per test, tables of value
overrides), written in pytest so `make unit` runs them with everything else. They need the
helm binary and nothing else: no cluster. Without helm they are skipped, not failed.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "trainwave"
NAMESPACE = "tw-system"
RELEASE = "tw"


def find_helm() -> str | None:
    """$HELM, then PATH, then the pinned binary `make tools` installs into the cache."""
    cache = Path(os.environ.get("TRAINWAVE_CACHE", Path.home() / ".cache" / "trainwave"))
    for candidate in (os.environ.get("HELM"), shutil.which("helm"), cache / "bin" / "helm"):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


HELM = find_helm()

pytestmark = pytest.mark.timeout(20)


def helm() -> str:
    """The helm binary, or skip the calling test: the schema generator tests still run."""
    if HELM is None:
        pytest.skip("helm is not installed (run `make tools`)")
    return HELM


@functools.cache
def helm_template(
    args: tuple[str, ...], release: str = RELEASE
) -> subprocess.CompletedProcess[str]:
    # Cached: many tests look at the same rendering, and each helm run costs ~0.1 s.
    command = [helm(), "template", release, str(CHART), "--namespace", NAMESPACE, *args]
    return subprocess.run(command, capture_output=True, text=True, check=False, timeout=15)


def render(*args: str, release: str = RELEASE) -> list[dict[str, Any]]:
    """The manifests rendered with extra helm flags (`--set a=b`, `--set-json ...`)."""
    result = helm_template(args, release)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def render_error(*args: str) -> str:
    """The error helm prints when the flags must make rendering fail."""
    result = helm_template(args)
    assert result.returncode != 0, f"helm template {' '.join(args)} should have failed"
    return result.stderr


def is_agent(doc: dict[str, Any]) -> bool:
    labels = doc["metadata"].get("labels") or {}
    return bool(labels.get("app.kubernetes.io/component") == "agent")


def find(
    manifests: list[dict[str, Any]], kind: str, *, agent: bool = False
) -> list[dict[str, Any]]:
    """Objects of one kind: the operator's and the release's, or with `agent` the node agent's
    (tests/unit/test_chart_agent.py), so neither set of tests counts the other's objects."""
    return [doc for doc in manifests if doc["kind"] == kind and is_agent(doc) == agent]


def one(manifests: list[dict[str, Any]], kind: str, *, agent: bool = False) -> dict[str, Any]:
    found = find(manifests, kind, agent=agent)
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def pod_spec(manifests: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = one(manifests, "Deployment")["spec"]["template"]["spec"]
    return spec


def container(manifests: list[dict[str, Any]]) -> dict[str, Any]:
    operator: dict[str, Any]
    (operator,) = pod_spec(manifests)["containers"]
    return operator


# --- names and labels -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("release", "args", "fullname"),
    [
        pytest.param("tw", (), "tw-trainwave", id="release-plus-chart"),
        pytest.param("trainwave", (), "trainwave", id="release-contains-chart"),
        pytest.param("tw", ("--set", "fullnameOverride=" + "f" * 70), "f" * 63, id="long-fullname"),
        pytest.param(
            "tw", ("--set", "fullnameOverride=" + "a" * 62 + "-b"), "a" * 62, id="trailing-dash"
        ),
        pytest.param(
            "tw", ("--set", "nameOverride=" + "n" * 70), ("tw-" + "n" * 70)[:63], id="long-name"
        ),
        pytest.param("r" * 53, (), ("r" * 53 + "-trainwave")[:63], id="longest-release"),
    ],
)
def test_names_are_truncated_to_63_chars(
    release: str, args: tuple[str, ...], fullname: str
) -> None:
    manifests = render(*args, release=release)
    assert one(manifests, "Deployment")["metadata"]["name"] == fullname
    for doc in manifests:
        name = doc["metadata"]["name"]
        assert len(name) <= 63, f"{doc['kind']} name {name!r} is longer than 63"
        assert not name.endswith("-"), f"{doc['kind']} name {name!r} ends with '-'"
    assert one(manifests, "Service")["metadata"]["name"].endswith("-metrics")


def test_every_object_carries_the_standard_labels() -> None:
    manifests = render()
    for doc in manifests:
        if doc["kind"] == "CustomResourceDefinition":
            continue  # generated from the API models, outside the chart's label helpers
        labels = doc["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == "trainwave"
        assert labels["app.kubernetes.io/instance"] == RELEASE
        assert labels["app.kubernetes.io/version"] == "0.1.0"
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        assert labels["helm.sh/chart"] == "trainwave-0.1.0"


def test_pod_labels_cannot_break_the_selector() -> None:
    manifests = render(
        "--set", "podLabels.team=ml", "--set", "podLabels.app\\.kubernetes\\.io/name=other"
    )
    deployment = one(manifests, "Deployment")
    selector = deployment["spec"]["selector"]["matchLabels"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= labels.items()
    assert labels["team"] == "ml"
    assert one(manifests, "Service")["spec"]["selector"] == selector


# --- RBAC ---------------------------------------------------------------------------------

# (apiGroup, resource) -> verbs. The whole grant: a rule added to the chart must be added
# here too, on purpose.
EXPECTED_RULES = {
    ("trainwave.io", "trainingjobs"): {"list", "watch", "delete"},
    ("trainwave.io", "trainingjobs/status"): {"patch"},
    ("trainwave.io", "trainingjobs/finalizers"): {"update"},
    ("", "pods"): {"list", "watch", "create", "patch", "delete"},
    ("", "services"): {"list", "watch", "create", "patch", "delete"},
    ("", "nodes"): {"list", "watch", "patch"},  # the straggler-until annotation only
    ("", "limitranges"): {"list", "watch"},
    ("", "resourcequotas"): {"list", "watch"},
    ("admissionregistration.k8s.io", "mutatingwebhookconfigurations"): {"list", "watch"},
    ("", "secrets"): {"create"},
    ("", "events"): {"create", "patch"},
    ("events.k8s.io", "events"): {"create", "patch"},
}


def granted(role: dict[str, Any]) -> dict[tuple[str, str], set[str]]:
    grants: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        assert set(rule) <= {"apiGroups", "resources", "verbs"}, f"unexpected rule fields {rule}"
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                grants.setdefault((group, resource), set()).update(rule["verbs"])
    return grants


def test_cluster_role_grants_exactly_the_expected_rules() -> None:
    assert granted(one(render(), "ClusterRole")) == EXPECTED_RULES


def test_kueue_adds_only_its_workload_and_flavor_rules() -> None:
    grants = granted(one(render("--set", "kueue.enabled=true"), "ClusterRole"))
    assert grants == {
        **EXPECTED_RULES,
        ("kueue.x-k8s.io", "workloads"): {"create", "list", "watch", "patch"},
        ("kueue.x-k8s.io", "workloads/status"): {"patch"},
        ("kueue.x-k8s.io", "resourceflavors"): {"list", "watch"},
    }
    assert "--kueue" in container(render("--set", "kueue.enabled=true"))["args"]
    assert "--kueue" not in container(render())["args"]


def test_cluster_role_is_least_privilege() -> None:
    grants = granted(one(render(), "ClusterRole"))
    # Each job's status-key Secret is created, never read back: no Secret is readable.
    assert grants[("", "secrets")] == {"create"}
    for (group, resource), verbs in grants.items():
        assert "*" not in (group, resource), f"wildcard in {group}/{resource}"
        assert "*" not in verbs, f"wildcard verb on {group}/{resource}"


def named(manifests: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [m for m in find(manifests, kind) if m["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, got {len(found)}"
    return found[0]


def test_the_operator_may_read_one_secret_its_master_status_key_by_name() -> None:
    manifests = render()
    name = f"{RELEASE}-trainwave-status-key"  # fullname, then the suffix
    role = named(manifests, "Role", name)
    assert role["metadata"]["namespace"] == NAMESPACE
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": [name], "verbs": ["get"]}
    ]
    binding = named(manifests, "RoleBinding", role["metadata"]["name"])
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"][0]["name"] == one(manifests, "ServiceAccount")["metadata"]["name"]
    args = one(manifests, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--status-key-secret") + 1] == f"{NAMESPACE}/{name}"


# What the operator may change in a namespace whose jobs it runs.
JOB_WRITES = {
    ("trainwave.io", "trainingjobs"): {"delete"},
    ("trainwave.io", "trainingjobs/status"): {"patch"},
    ("trainwave.io", "trainingjobs/finalizers"): {"update"},
    ("", "pods"): {"create", "patch", "delete"},
    ("", "services"): {"create", "patch", "delete"},
    ("", "secrets"): {"create"},
    ("", "events"): {"create", "patch"},
    ("events.k8s.io", "events"): {"create", "patch"},
}


# What the operator lists and watches in a namespace whose jobs it runs.
JOB_READS = {
    ("trainwave.io", "trainingjobs"): {"list", "watch"},
    ("", "services"): {"list", "watch"},
    ("", "limitranges"): {"list", "watch"},
    ("", "resourcequotas"): {"list", "watch"},
}
KUEUE_WORKLOADS = {
    ("kueue.x-k8s.io", "workloads"): {"create", "list", "watch", "patch"},
    ("kueue.x-k8s.io", "workloads/status"): {"patch"},
}


def merged(*grants: dict[tuple[str, str], set[str]]) -> dict[tuple[str, str], set[str]]:
    union: dict[tuple[str, str], set[str]] = {}
    for grant in grants:
        for key, verbs in grant.items():
            union.setdefault(key, set()).update(verbs)
    return union


def test_with_watch_namespaces_reads_and_writes_are_granted_there_only() -> None:
    manifests = render("--set-json", 'watchNamespaces=["team-a","team-b"]')
    cluster_wide = granted(one(manifests, "ClusterRole"))
    assert cluster_wide == {
        ("", "pods"): {"list", "watch"},  # other workloads hold GPUs too: placement reads all
        ("", "nodes"): {"list", "watch", "patch"},
        ("admissionregistration.k8s.io", "mutatingwebhookconfigurations"): {"list", "watch"},
    }  # no jobs, Services, LimitRanges, ResourceQuotas or Events: the Roles below grant them
    account = one(manifests, "ServiceAccount")["metadata"]["name"]
    roles = [r for r in find(manifests, "Role") if r["metadata"]["namespace"] != NAMESPACE]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    for role in roles:
        assert granted(role) == merged(JOB_READS, JOB_WRITES)
        [binding] = [
            b for b in find(manifests, "RoleBinding")
            if b["metadata"]["namespace"] == role["metadata"]["namespace"]
        ]  # fmt: skip
        assert binding["roleRef"]["name"] == role["metadata"]["name"]
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}
        ]
    # The master status key is still created on first start, now by the release's own Role.
    key = named(manifests, "Role", f"{RELEASE}-trainwave-status-key")
    assert {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]} in key["rules"]


def test_with_watch_namespaces_kueue_workloads_are_granted_there_only() -> None:
    manifests = render(
        "--set-json", 'watchNamespaces=["team-a"]', "--set", "kueue.enabled=true"
    )  # fmt: skip
    cluster_wide = granted(one(manifests, "ClusterRole"))
    assert cluster_wide[("kueue.x-k8s.io", "resourceflavors")] == {"list", "watch"}
    assert not KUEUE_WORKLOADS.keys() & cluster_wide.keys()
    [role] = [r for r in find(manifests, "Role") if r["metadata"]["namespace"] == "team-a"]
    assert granted(role) == merged(JOB_READS, JOB_WRITES, KUEUE_WORKLOADS)


def test_watching_every_namespace_grants_no_namespaced_job_roles() -> None:
    manifests = render()
    assert all(r["metadata"]["namespace"] == NAMESPACE for r in find(manifests, "Role"))
    assert {k: EXPECTED_RULES[k] >= v for k, v in JOB_WRITES.items()} == dict.fromkeys(
        JOB_WRITES, True
    )


def test_binding_ties_the_role_to_the_service_account() -> None:
    manifests = render()
    binding = one(manifests, "ClusterRoleBinding")
    account = one(manifests, "ServiceAccount")
    assert binding["roleRef"]["name"] == one(manifests, "ClusterRole")["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": NAMESPACE}
    ]
    assert pod_spec(manifests)["serviceAccountName"] == account["metadata"]["name"]


def test_rbac_create_false_renders_no_rbac() -> None:
    manifests = render("--set", "rbac.create=false")
    assert not find(manifests, "ClusterRole")
    assert not find(manifests, "ClusterRoleBinding")


def test_existing_service_account_is_used_not_created() -> None:
    manifests = render("--set", "serviceAccount.create=false", "--set", "serviceAccount.name=ops")
    assert not find(manifests, "ServiceAccount")
    assert pod_spec(manifests)["serviceAccountName"] == "ops"
    assert one(manifests, "ClusterRoleBinding")["subjects"][0]["name"] == "ops"


def test_existing_service_account_needs_a_name() -> None:
    error = render_error("--set", "serviceAccount.create=false")
    assert "serviceAccount.name is required" in error


# --- the operator Deployment ----------------------------------------------------------------

DEFAULT_ARGS = [
    "operator",
    "--metrics-port", "9090",
    "--health-port", "8080",
    "--log-level", "info",
    "--topology-levels", "trainwave.io/spine,trainwave.io/rack,kubernetes.io/hostname",
    "--runtime-image", "trainwave/runtime:0.1.0",
    "--status-key-secret", f"{NAMESPACE}/{RELEASE}-trainwave-status-key",
    "--status-interval-seconds", "15",
]  # fmt: skip
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
            ["operator", "--metrics-port", "9100", "--health-port", "8081", "--log-level", "debug",
             *DEFAULT_ARGS[7:]],
            id="ports-and-log-level",
        ),
        pytest.param(
            ("--set-json", 'topology.levels=["rack","kubernetes.io/hostname"]'),
            [*DEFAULT_ARGS[:7], "--topology-levels", "rack,kubernetes.io/hostname",
             *DEFAULT_ARGS[9:]],
            id="topology-levels",
        ),
        pytest.param(
            ("--set", "runtime.image=mirror.example/trainwave/runtime:0.1.0"),
            [*DEFAULT_ARGS[:9], "--runtime-image", "mirror.example/trainwave/runtime:0.1.0",
             *DEFAULT_ARGS[11:]],
            id="runtime-image",
        ),
        pytest.param(
            ("--set", "runtime.statusIntervalSeconds=2"),
            [*DEFAULT_ARGS[:-1], "2"],
            id="status-interval",
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


# --- CRD and ServiceMonitor toggles ---------------------------------------------------------

KEEP = "helm.sh/resource-policy"


@pytest.mark.parametrize(
    ("args", "present", "kept"),
    [
        pytest.param((), True, True, id="default-installed-and-kept"),
        pytest.param(("--set", "crds.keep=false"), True, False, id="not-kept"),
        pytest.param(("--set", "crds.enabled=false"), False, False, id="disabled"),
    ],
)
def test_crd_toggles(args: tuple[str, ...], present: bool, kept: bool) -> None:
    crds = find(render(*args), "CustomResourceDefinition")
    assert [crd["metadata"]["name"] for crd in crds] == (
        ["trainingjobs.trainwave.io"] if present else []
    )
    if present:
        annotations = crds[0]["metadata"].get("annotations") or {}
        assert (annotations.get(KEEP) == "keep") is kept


def test_service_monitor_is_off_by_default() -> None:
    assert not find(render(), "ServiceMonitor")


def test_service_monitor_scrapes_the_metrics_service() -> None:
    manifests = render(
        "--set", "metrics.serviceMonitor.enabled=true",
        "--set", "metrics.serviceMonitor.labels.release=prometheus",
        "--set", "metrics.serviceMonitor.interval=15s",
    )  # fmt: skip
    monitor = one(manifests, "ServiceMonitor")
    service = one(manifests, "Service")
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert monitor["spec"]["endpoints"] == [
        {"port": "metrics", "path": "/metrics", "interval": "15s"}
    ]


def test_service_monitor_needs_the_service() -> None:
    error = render_error(
        "--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.service.enabled=false"
    )
    assert "needs metrics.service.enabled" in error


# --- values.schema.json ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(("--set", "imagee.tag=x"), "additional properties 'imagee'", id="unknown-key"),
        pytest.param(("--set", "image.tga=x"), "additional properties 'tga'", id="unknown-nested"),
        pytest.param(("--set", "metrics.port=abc"), "want integer", id="wrong-type"),
        pytest.param(("--set", "image.tag=2"), "want string", id="numeric-tag"),
        pytest.param(("--set", "logLevel=verbose"), "must be one of", id="not-in-enum"),
        pytest.param(("--set", "health.port=70000"), "maximum", id="out-of-range"),
        pytest.param(
            ("--set", "runtime.statusIntervalSeconds=0"), "minimum", id="status-interval-zero"
        ),
        pytest.param(("--set", "podAnnotations.a=1"), "want string", id="annotation-not-string"),
        pytest.param(
            ("--set-json", 'watchNamespaces=["team-*"]'),
            "does not match pattern",
            id="namespace-pattern",
        ),
    ],
)
def test_schema_rejects_bad_values(args: tuple[str, ...], message: str) -> None:
    error = render_error(*args)
    assert "values don't meet the specifications of the schema" in error
    assert message in error


def test_schema_is_generated_from_values() -> None:
    # `make check-generated` does this too; here it fails next to the chart tests.
    result = subprocess.run(
        [sys.executable, str(ROOT / "hack" / "values_schema.py"), str(CHART / "values.yaml")],
        capture_output=True,
        text=True,
        check=True,
        timeout=15,
    )
    committed = (CHART / "values.schema.json").read_text(encoding="utf-8")
    assert result.stdout == committed, "values.schema.json is stale: run `make generate`"


def test_schema_generator_refuses_an_undocumented_value(tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text("# -- Documented.\ndocumented: 1\nundocumented: 2\n", encoding="utf-8")
    result = subprocess.run(
        [sys.executable, str(ROOT / "hack" / "values_schema.py"), str(values)],
        capture_output=True,
        text=True,
        check=False,
        timeout=15,
    )
    assert result.returncode == 1
    assert f'{values}:3: undocumented: no "# -- <description>" comment' in result.stderr


def test_helm_lint_strict_passes() -> None:
    result = subprocess.run(
        [helm(), "lint", "--strict", str(CHART)],
        capture_output=True,
        text=True,
        check=False,
        timeout=15,
    )
    assert result.returncode == 0, result.stdout + result.stderr
