"""Chart tests for the node agent: DaemonSet, its ServiceAccount and its least-privilege RBAC.

Rendering helpers come from chart_render.py; `agent=True` selects the agent's objects.
"""

from __future__ import annotations

from typing import Any

import pytest
from chart_render import NAMESPACE, RELEASE, find, granted, one, render, render_error

pytestmark = pytest.mark.timeout(20)

AGENT_KINDS = ("DaemonSet", "ServiceAccount", "ClusterRole", "ClusterRoleBinding")
# The whole grant of the agent: its own Node, nothing else.
AGENT_RULES = {("", "nodes"): {"get", "patch"}, ("", "nodes/status"): {"patch"}}


def daemonset(*args: str) -> dict[str, Any]:
    return one(render(*args), "DaemonSet", agent=True)


def agent_pod(*args: str) -> dict[str, Any]:
    spec: dict[str, Any] = daemonset(*args)["spec"]["template"]["spec"]
    return spec


def agent_container(*args: str) -> dict[str, Any]:
    container: dict[str, Any]
    (container,) = (c for c in agent_pod(*args)["containers"] if c["name"] == "agent")
    return container


def flag(container: dict[str, Any], name: str) -> str:
    args: list[str] = container["args"]
    return args[args.index(name) + 1]


# --- what is rendered ---------------------------------------------------------------------


def test_agent_is_on_by_default_and_off_when_disabled() -> None:
    for kind in AGENT_KINDS:
        assert len(find(render(), kind, agent=True)) == 1, kind
        assert not find(render("--set", "agent.enabled=false"), kind, agent=True), kind


def test_disabling_the_agent_leaves_the_operator_alone() -> None:
    """But for the arbiter's sockets, which only the agent's pods serve."""
    on = render("--set", "agent.arbiter.enabled=false")
    off = render("--set", "agent.enabled=false")
    assert [d for d in on if not find([d], d["kind"], agent=True)] == off


ARBITER_DIR = "/run/trainwave/arbiter"


def test_the_arbiter_runs_beside_the_agent_and_the_operator_mounts_its_sockets() -> None:
    manifests = render()
    pod = agent_pod()
    arbiter = next(c for c in pod["containers"] if c["name"] == "arbiter")
    assert arbiter["command"][-2:] == ["--directory", ARBITER_DIR]
    assert {m["mountPath"] for m in arbiter["volumeMounts"]} == {ARBITER_DIR}
    assert flag(agent_container(), "--arbiter-dir") == ARBITER_DIR
    (init,) = pod["initContainers"]
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN"]}
    assert init["command"][-3:] == [ARBITER_DIR, "65532", "65532"]
    volume = next(v for v in pod["volumes"] if v["name"] == "arbiter")
    assert volume["hostPath"] == {"path": ARBITER_DIR, "type": "DirectoryOrCreate"}
    operator = one(manifests, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert operator["args"][operator["args"].index("--arbiter-dir") + 1] == ARBITER_DIR


def test_the_arbiter_directory_is_writable_by_the_pod_group() -> None:
    """With agent.gpuClaims the agent runs as root without capabilities: it writes the
    arbiter's list through the directory's group (found on the real node)."""
    (init,) = agent_pod("--set", "agent.gpuClaims=true")["initContainers"]
    code = init["command"][2]
    assert "os.chown(d, 0, 0); os.chmod(d, 0o775);" in code, code
    assert code.rstrip().endswith("os.chown(d, int(sys.argv[2]), int(sys.argv[3]))"), code


@pytest.mark.parametrize(
    ("args", "kubelet", "cdi"),
    [
        pytest.param((), "/var/lib/kubelet", "/var/run/cdi", id="defaults"),
        pytest.param(
            ("--set", "agent.kubeletDir=/var/lib/k0s/kubelet", "--set", "agent.cdiDir=/etc/cdi"),
            "/var/lib/k0s/kubelet",
            "/etc/cdi",
            id="k0s-etc-cdi",
        ),
    ],
)
def test_the_kubelet_plugin_serves_and_writes_where_the_node_looks(
    args: tuple[str, ...], kubelet: str, cdi: str
) -> None:
    """GetInfo names the socket by its path in the container, which the kubelet dials on
    the host: every directory is mounted at its host path."""
    pod = agent_pod("--set", "agent.gpuClaims=true", *args)
    (agent,) = (c for c in pod["containers"] if c["name"] == "agent")
    assert (flag(agent, "--kubelet-dir"), flag(agent, "--cdi-dir")) == (kubelet, cdi)
    wanted = {
        "plugins-registry": f"{kubelet}/plugins_registry",
        "plugins": f"{kubelet}/plugins",
        "cdi": cdi,
    }
    mounts = {m["name"]: m["mountPath"] for m in agent["volumeMounts"]}
    paths = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    for name, path in wanted.items():
        assert (mounts[name], paths[name]) == (path, path), name


@pytest.mark.parametrize(
    "args",
    [("--set", "agent.arbiter.enabled=false"), ("--set", "agent.enabled=false")],
    ids=["arbiter-off", "agent-off"],
)
def test_without_the_arbiter_the_operator_mounts_no_sockets(args: tuple[str, ...]) -> None:
    operator = one(render(*args), "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert "--arbiter-dir" not in operator["args"]


@pytest.mark.parametrize(
    ("release", "args", "name"),
    [
        pytest.param("tw", (), "tw-trainwave-agent", id="release-plus-chart"),
        pytest.param(
            "tw", ("--set", "fullnameOverride=" + "f" * 70), "f" * 57 + "-agent", id="long-name"
        ),
    ],
)
def test_agent_names_keep_their_suffix_within_63(
    release: str, args: tuple[str, ...], name: str
) -> None:
    manifests = render(*args, release=release)
    for kind in AGENT_KINDS:
        assert one(manifests, kind, agent=True)["metadata"]["name"] == name


# --- RBAC ---------------------------------------------------------------------------------


def test_agent_role_grants_only_its_node() -> None:
    assert granted(one(render(), "ClusterRole", agent=True)) == AGENT_RULES


def test_agent_binding_ties_its_role_to_its_account() -> None:
    manifests = render()
    binding = one(manifests, "ClusterRoleBinding", agent=True)
    account = one(manifests, "ServiceAccount", agent=True)
    assert (
        binding["roleRef"]["name"] == one(manifests, "ClusterRole", agent=True)["metadata"]["name"]
    )
    assert binding["subjects"][0]["name"] == account["metadata"]["name"]
    assert agent_pod()["serviceAccountName"] == account["metadata"]["name"]
    assert account["metadata"]["name"] != one(manifests, "ServiceAccount")["metadata"]["name"]


# --- only its own Node: the admission policy ---------------------------------------------


def test_agent_may_change_only_the_node_its_token_names() -> None:
    manifests = render()
    policy = one(manifests, "ValidatingAdmissionPolicy", agent=True)
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    [rule] = spec["matchConstraints"]["resourceRules"]
    assert set(rule["resources"]) == {"nodes", "nodes/status"}
    assert "UPDATE" in rule["operations"], "a PATCH is admitted as an UPDATE"
    [only_the_agent] = spec["matchConditions"]
    account = f"system:serviceaccount:{NAMESPACE}:{RELEASE}-trainwave-agent"
    assert only_the_agent["expression"] == f'request.userInfo.username == "{account}"'
    [token_node] = spec["variables"]
    assert "authentication.kubernetes.io/node-name" in token_node["expression"]
    [check] = spec["validations"]
    assert check["expression"] == "variables.tokenNode != '' && variables.tokenNode == request.name"
    binding = one(manifests, "ValidatingAdmissionPolicyBinding", agent=True)
    assert binding["spec"] == {
        "policyName": policy["metadata"]["name"],
        "validationActions": ["Deny"],
    }


def test_the_policy_follows_an_existing_agent_account() -> None:
    manifests = render(
        "--set", "agent.serviceAccount.create=false", "--set", "agent.serviceAccount.name=probe"
    )
    [condition] = one(manifests, "ValidatingAdmissionPolicy", agent=True)["spec"]["matchConditions"]
    assert f"system:serviceaccount:{NAMESPACE}:probe" in condition["expression"]


@pytest.mark.parametrize(
    "args",
    [("--set", "agent.ownNodeOnly=false"), ("--set", "agent.enabled=false")],
    ids=["own-node-only-off", "agent-off"],
)
def test_no_policy_when_turned_off(args: tuple[str, ...]) -> None:
    manifests = render(*args)
    for kind in ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"):
        assert not find(manifests, kind, agent=True), kind


def test_rbac_create_false_renders_no_agent_rbac() -> None:
    manifests = render("--set", "rbac.create=false")
    assert not find(manifests, "ClusterRole", agent=True)
    assert not find(manifests, "ClusterRoleBinding", agent=True)


def test_existing_agent_account_is_used_not_created() -> None:
    args = ("--set", "agent.serviceAccount.create=false", "--set", "agent.serviceAccount.name=ag")
    manifests = render(*args)
    assert not find(manifests, "ServiceAccount", agent=True)
    assert agent_pod(*args)["serviceAccountName"] == "ag"
    assert one(manifests, "ClusterRoleBinding", agent=True)["subjects"][0]["name"] == "ag"


def test_existing_agent_account_needs_a_name() -> None:
    error = render_error("--set", "agent.serviceAccount.create=false")
    assert "agent.serviceAccount.name is required" in error


# --- the DaemonSet ------------------------------------------------------------------------


def test_selector_never_matches_the_operator() -> None:
    manifests = render("--set", "agent.podLabels.app\\.kubernetes\\.io/component=operator")
    agent = one(manifests, "DaemonSet", agent=True)["spec"]
    operator = one(manifests, "Deployment")["spec"]
    agent_labels = agent["template"]["metadata"]["labels"]
    operator_labels = operator["template"]["metadata"]["labels"]
    assert agent["selector"]["matchLabels"].items() <= agent_labels.items()
    assert not agent["selector"]["matchLabels"].items() <= operator_labels.items()
    assert not operator["selector"]["matchLabels"].items() <= agent_labels.items()


FLAGS = [
    pytest.param(
        (), {"--interval": "60", "--shared-gpus": "none", "--log-level": "info"}, id="defaults"
    ),
    pytest.param(("--set", "agent.interval=15"), {"--interval": "15"}, id="interval"),
    pytest.param(("--set", "agent.sharedGpus=all"), {"--shared-gpus": "all"}, id="share-all"),
    pytest.param(
        ("--set-string", "agent.sharedGpus=0\\,3"), {"--shared-gpus": "0,3"}, id="share-some"
    ),
    pytest.param(("--set", "agent.logLevel=debug"), {"--log-level": "debug"}, id="log-level"),
]


@pytest.mark.parametrize(("args", "flags"), FLAGS)
def test_values_become_agent_flags(args: tuple[str, ...], flags: dict[str, str]) -> None:
    container = agent_container(*args)
    assert container["args"][0] == "agent"
    assert flag(container, "--root") == "/host"
    for name, value in flags.items():
        assert flag(container, name) == value


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(("--set", "agent.sharedGpus=half"), "/agent/sharedGpus", id="bad-sharing"),
        pytest.param(("--set", "agent.interval=0"), "/agent/interval", id="zero-interval"),
        pytest.param(("--set", "agent.intervall=5"), "intervall", id="misspelt-key"),
    ],
)
def test_schema_refuses_bad_agent_values(args: tuple[str, ...], message: str) -> None:
    assert message in render_error(*args)


def test_node_name_comes_from_the_downward_api() -> None:
    env = {e["name"]: e for e in agent_container()["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"


def test_host_sys_and_proc_are_mounted_read_only_under_the_root() -> None:
    pod = agent_pod()
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in pod["containers"][0]["volumeMounts"]}
    for host_path in ("/sys", "/proc"):
        mount = mounts["/host" + host_path]
        assert mount["readOnly"] is True
        assert volumes[mount["name"]]["hostPath"]["path"] == host_path


@pytest.mark.parametrize(
    ("args", "runtime_class", "visible"),
    [
        pytest.param((), "nvidia", "all", id="gpu-operator-defaults"),
        pytest.param(
            ("--set", "agent.runtimeClassName=", "--set", "agent.nvidiaVisibleDevices="),
            None,
            None,
            id="nvidia-default-runtime",
        ),
    ],
)
def test_nvml_access(args: tuple[str, ...], runtime_class: str | None, visible: str | None) -> None:
    pod = agent_pod(*args)
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert pod.get("runtimeClassName") == runtime_class
    assert env.get("NVIDIA_VISIBLE_DEVICES") == visible
    assert "resources" not in pod or "nvidia.com/gpu" not in str(pod["containers"][0]["resources"])


def test_agent_runs_unprivileged() -> None:
    pod = agent_pod()
    container = pod["containers"][0]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert not container["securityContext"].get("privileged")
    assert not any(pod.get(key) for key in ("hostNetwork", "hostPID", "hostIPC"))


@pytest.mark.parametrize(
    ("args", "selector", "tolerations"),
    [
        pytest.param(
            (),
            {"nvidia.com/gpu.present": "true"},
            [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            id="defaults",
        ),
        pytest.param(
            (
                "--set-json", 'agent.nodeSelector={"pool":"gpu","nvidia.com/gpu.present":null}',
                "--set-json", 'agent.tolerations=[{"operator":"Exists"}]',
            ),
            {"pool": "gpu"},
            [{"operator": "Exists"}],
            id="default-selector-replaced-with-null",
        ),
    ],
)  # fmt: skip
def test_placement_of_agent_pods(
    args: tuple[str, ...], selector: dict[str, str], tolerations: list[dict[str, str]]
) -> None:
    pod = agent_pod(*args)
    assert pod["nodeSelector"] == selector
    assert pod["tolerations"] == tolerations


FAKE_GPUS_FILE = "/var/lib/trainwave/fake-gpus.json"


def test_a_fake_gpu_file_is_mounted_read_only_and_read_instead_of_nvml() -> None:
    """agent.fakeGpus: clusters without GPUs (the e2e tier's real node) describe them in a
    host file; without it the agent reads NVML and mounts no such file."""
    pod = agent_pod("--set", f"agent.fakeGpus={FAKE_GPUS_FILE}")
    (agent,) = (c for c in pod["containers"] if c["name"] == "agent")
    assert flag(agent, "--fake-gpus") == "/etc/trainwave/fake-gpus.json"
    (mount,) = (m for m in agent["volumeMounts"] if m["name"] == "fake-gpus")
    assert mount == {"name": "fake-gpus", "mountPath": "/etc/trainwave/fake-gpus.json",
                     "readOnly": True}  # fmt: skip
    (volume,) = (v for v in pod["volumes"] if v["name"] == "fake-gpus")
    assert volume["hostPath"] == {"path": FAKE_GPUS_FILE, "type": "File"}
    assert "--fake-gpus" not in agent_container()["args"]
    assert "fake-gpus" not in {v["name"] for v in agent_pod()["volumes"]}


def test_a_fake_gpu_file_is_an_absolute_host_path() -> None:
    assert "does not match pattern" in render_error("--set", "agent.fakeGpus=gpus.json")
