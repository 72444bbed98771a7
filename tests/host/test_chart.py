"""Chart tests: render charts/trainwave with `helm template` and assert on the manifests.

The style of cert-manager's helm-unittest suites (one behaviour per test, tables of value
overrides), written in pytest. They need the helm binary and nothing else: no cluster.
Without helm they are skipped, not failed (chart_render.py). This module: names, labels
and RBAC; test_chart_operator.py the operator's Deployment; test_chart_toggles.py the
CRD and ServiceMonitor switches and values.schema.json.
"""

from __future__ import annotations

import pytest
from chart_render import (
    NAMESPACE,
    RELEASE,
    container,
    find,
    granted,
    named,
    one,
    pod_spec,
    render,
    render_error,
)

pytestmark = pytest.mark.timeout(20)

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
    ("", "services"): {"create", "patch", "delete"},
    ("discovery.k8s.io", "endpointslices"): {
        "list",
        "watch",
        "create",
        "patch",
        "deletecollection",
    },
    ("", "endpoints"): {"deletecollection"},  # kube-controller-manager's, left by a selector
    ("", "nodes"): {"list", "watch", "patch"},  # the straggler-until annotation only
    ("", "limitranges"): {"list", "watch"},
    ("", "resourcequotas"): {"list", "watch"},
    ("admissionregistration.k8s.io", "mutatingwebhookconfigurations"): {"list", "watch"},
    ("", "secrets"): {"create"},
    # list: the Events of a worker sitting Pending (controller/pod_events.py)
    ("", "events"): {"create", "patch", "list"},
    ("events.k8s.io", "events"): {"create", "patch"},
}


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
    ("discovery.k8s.io", "endpointslices"): {"create", "patch", "deletecollection"},
    ("", "endpoints"): {"deletecollection"},
    ("", "secrets"): {"create"},
    ("", "events"): {"create", "patch"},
    ("events.k8s.io", "events"): {"create", "patch"},
}


# What the operator lists and watches in a namespace whose jobs it runs.
JOB_READS = {
    ("trainwave.io", "trainingjobs"): {"list", "watch"},
    ("discovery.k8s.io", "endpointslices"): {"list", "watch"},
    ("", "limitranges"): {"list", "watch"},
    ("", "resourcequotas"): {"list", "watch"},
    ("", "events"): {"list"},
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
