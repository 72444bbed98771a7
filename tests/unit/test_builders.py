"""Builders: worker pods and the headless Service, as pure functions of the job."""

from __future__ import annotations

import re
from typing import Any

import pytest
from factories import NAMESPACE, make_job

from trainwave import contract
from trainwave.api.trainingjob import InvalidSpec, TrainingJob
from trainwave.builders.names import master_address, worker_hostname, worker_pod_name
from trainwave.builders.pods import build_worker_pods
from trainwave.builders.service import build_endpoint_slices, build_service
from trainwave.lifecycle.endpoints import Published
from trainwave.resolving import check_template, resolve_job

pytestmark = pytest.mark.timeout(10)


def build(job: TrainingJob, rank: int = 0, attempt: int = 0) -> dict[str, Any]:
    (pod,) = build_worker_pods(resolve_job(job), (rank,), attempt)
    return pod


def worker(pod: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any]
    (container,) = [c for c in pod["spec"]["containers"] if c["name"] == "worker"]
    return container


def env_of(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in worker(pod)["env"]}


# --- names and identity -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("job", "rank", "attempt", "pod", "host"),
    [
        pytest.param("demo", 0, 0, "demo-a0-worker-0", "demo-worker-0", id="first"),
        pytest.param("demo", 7, 3, "demo-a3-worker-7", "demo-worker-7", id="restarted"),
        pytest.param("x" * 51, 9999, 0, "x" * 51 + "-a0-worker-9999", "x" * 51 + "-worker-9999",
                     id="longest"),
    ],
)  # fmt: skip
def test_names(job: str, rank: int, attempt: int, pod: str, host: str) -> None:
    assert worker_pod_name(job, rank, attempt) == pod
    assert worker_hostname(job, rank) == host
    assert len(host) <= 63, "a hostname must fit a DNS label"


def test_pod_identity_labels_and_owner() -> None:
    job = make_job(template={"metadata": {"labels": {"team": "ml"}, "annotations": {"a": "b"}}})
    pod = build(job, rank=1, attempt=2)
    meta = pod["metadata"]
    assert (meta["name"], meta["namespace"]) == ("demo-a2-worker-1", NAMESPACE)
    assert meta["labels"] == {
        "team": "ml",
        contract.LABEL_JOB_NAME: "demo",
        contract.LABEL_ROLE: "worker",
        contract.LABEL_RANK: "1",
        contract.LABEL_ATTEMPT: "2",
    }
    assert meta["annotations"] == {
        "a": "b",
        "trainwave.io/priority": "0",
        "trainwave.io/preemptible": "true",
    }, "the template's own, plus what the placer reads of a running gang"
    assert meta["ownerReferences"] == [
        {"apiVersion": "trainwave.io/v1alpha1", "kind": "TrainingJob", "name": "demo",
         "uid": "uid-1", "controller": True, "blockOwnerDeletion": True},
    ]  # fmt: skip
    spec = pod["spec"]
    assert (spec["hostname"], spec["subdomain"]) == ("demo-worker-1", "demo-a2")
    assert spec["restartPolicy"] == "Never"


def test_template_labels_cannot_override_trainwave_labels() -> None:
    job = make_job(template={"metadata": {"labels": {contract.LABEL_RANK: "99"}}})
    assert build(job, rank=1)["metadata"]["labels"][contract.LABEL_RANK] == "1"


# --- the torch contract -------------------------------------------------------------------


@pytest.mark.parametrize(("workers", "per_worker"), [(1, 1), (2, 1), (4, 8), (3, 2)],
                         ids=["single", "two-pods", "4x8", "3x2"])  # fmt: skip
def test_torch_env_per_rank(workers: int, per_worker: int) -> None:
    job = make_job(workers=workers, processes_per_worker=per_worker, masterPort=23456)
    pods = build_worker_pods(resolve_job(job), tuple(range(workers)), attempt=5)
    master = master_address("demo", 5)
    assert master == "demo-worker-0.demo-a5", "a recreated gang's names are new (names.py)"
    for rank, pod in enumerate(pods):
        assert env_of(pod) == {
            "MASTER_ADDR": master,
            "MASTER_PORT": "23456",
            "WORLD_SIZE": str(workers * per_worker),
            "RANK": str(rank * per_worker),
            "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": str(per_worker),
            "NODE_RANK": str(rank),
            "PET_NNODES": str(workers),
            "PET_NPROC_PER_NODE": str(per_worker),
            "PET_NODE_RANK": str(rank),
            "PET_MASTER_ADDR": master,
            "PET_MASTER_PORT": "23456",
            "TRAINWAVE_JOB_NAME": "demo",
            "TRAINWAVE_JOB_NAMESPACE": NAMESPACE,
            "TRAINWAVE_ATTEMPT": "5",
        }
    assert sorted(int(env_of(p)["RANK"]) for p in pods) == list(range(0, workers * per_worker,
                                                                      per_worker))  # fmt: skip


def test_torch_env_comes_first_so_user_values_can_refer_to_it() -> None:
    declared = {"name": "worker", "env": [{"name": "FROM_TPL", "value": "t"}, {"name": "B"}]}
    template = {"spec": {"containers": [declared]}}
    job = make_job(env=(("A", "1"), ("B", "2")), template=template)
    names = [e["name"] for e in worker(build(job))["env"]]
    # The in-place restart names (PET_RDZV_*, ...) come with the runtime only.
    present = [name for name in contract.RESERVED_ENV if name in names]
    reserved = len(present)
    assert names[:reserved] == present, "$(RANK) needs RANK defined earlier"
    assert names[reserved:] == ["FROM_TPL", "A", "B"], "template env, then spec.env (which wins)"
    assert len(names) == len(set(names))
    assert env_of(build(job))["B"] == "2"


# --- the worker container and the template -----------------------------------------------

TEMPLATE: dict[str, Any] = {
    "spec": {
        "tolerations": [{"key": "gpu", "operator": "Exists"}],
        "volumes": [{"name": "data", "emptyDir": {}}],
        "containers": [
            {"name": "sidecar", "image": "busybox"},
            {
                "name": "worker",
                "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                "ports": [{"name": "metrics", "containerPort": 9000}],
                "resources": {"requests": {"cpu": "1"}, "limits": {"memory": "1Gi"}},
            },
        ],
    }
}


def test_template_merge_keeps_the_users_pod() -> None:
    job = make_job(
        template=TEMPLATE,
        gpus_per_worker=8,
        resources={"requests": {"cpu": 16, "memory": "64Gi"}},
        command=["torchrun"],
        args=["train.py"],
        imagePullPolicy="Always",
    )
    pod = build(job)
    spec = pod["spec"]
    assert spec["tolerations"] == [{"key": "gpu", "operator": "Exists"}]
    assert spec["volumes"] == [{"name": "data", "emptyDir": {}}]
    assert [c["name"] for c in spec["containers"]] == ["sidecar", "worker"]
    assert spec["containers"][0] == {"name": "sidecar", "image": "busybox"}
    container = worker(pod)
    assert container["volumeMounts"] == [{"name": "data", "mountPath": "/data"}]
    assert container["image"] == "example/train:1.0"
    assert container["imagePullPolicy"] == "Always"
    assert (container["command"], container["args"]) == (["torchrun"], ["train.py"])
    assert container["ports"] == [
        {"name": "metrics", "containerPort": 9000},
        {"name": "rendezvous", "containerPort": 29500},
    ]
    assert container["resources"] == {
        "requests": {"cpu": 16, "memory": "64Gi"},
        "limits": {"memory": "1Gi", "nvidia.com/gpu": 8},
    }
    assert TEMPLATE["spec"]["containers"][1]["resources"]["requests"] == {"cpu": "1"}, (
        "the job's template must not be mutated"
    )


def test_worker_container_is_added_first_when_not_declared() -> None:
    pod = build(make_job(template={"spec": {"containers": [{"name": "sidecar", "image": "s"}]}}))
    assert [c["name"] for c in pod["spec"]["containers"]] == ["worker", "sidecar"]


@pytest.mark.parametrize(("gpus", "limits"), [(0, None), (1, {"nvidia.com/gpu": 1}),
                                              (8, {"nvidia.com/gpu": 8})],
                         ids=["cpu-only", "one-gpu", "eight-gpus"])  # fmt: skip
def test_gpus_are_limits(gpus: int, limits: dict[str, int] | None) -> None:
    resources = worker(build(make_job(gpus_per_worker=gpus)))["resources"]
    assert resources.get("limits") == limits
    assert "nvidia.com/gpu" not in resources.get("requests", {})


def test_minimal_job_builds_a_minimal_pod() -> None:
    container = worker(build(make_job()))
    assert set(container) == {"name", "image", "ports", "resources", "env"}
    assert container["resources"] == {}


def test_pods_are_deterministic() -> None:
    job = make_job(template=TEMPLATE, gpus_per_worker=2)
    assert build_worker_pods(resolve_job(job), (0, 1), 1) == build_worker_pods(
        resolve_job(job), (0, 1), 1
    )


# --- check_template -----------------------------------------------------------------------


def _containers(*containers: Any) -> dict[str, Any]:
    return {"spec": {"containers": list(containers)}}


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        pytest.param({"spec": {"hostname": "h"}}, "spec.template.spec.hostname", id="hostname"),
        pytest.param({"spec": {"subdomain": "s"}}, "spec.template.spec.subdomain", id="subdomain"),
        pytest.param({"spec": {"restartPolicy": "Always"}},
                     "spec.template.spec.restartPolicy is 'Always'", id="restart-always"),
        pytest.param({"spec": {"restartPolicy": "OnFailure"}}, "accepted: 'Never'",
                     id="restart-on-failure"),
        pytest.param(_containers({"name": "worker", "env": [{"name": "RANK", "value": "3"}]}),
                     "containers[worker].env sets RANK", id="reserved-env-worker"),
        pytest.param(_containers({"name": "side", "env": [{"name": "MASTER_ADDR"},
                                                          {"name": "WORLD_SIZE"}]}),
                     "containers[side].env sets MASTER_ADDR, WORLD_SIZE", id="reserved-env-side"),
        pytest.param({"spec": {"containers": {"name": "worker"}}}, "spec.template.spec.containers",
                     id="containers-not-a-list"),
        pytest.param(_containers({"image": "x"}), "containers[0].name must be set",
                     id="container-no-name"),
        pytest.param(_containers("worker"),
                     "spec.template.spec.containers[0] must be an object (got 'worker')",
                     id="container-a-string"),
        pytest.param(_containers({"name": "worker", "env": {"A": "1"}}),
                     "containers[worker].env must be a list", id="env-a-map"),
        pytest.param(_containers({"name": "worker", "env": ["A=1"]}),
                     "containers[worker].env[0] must be an object (got 'A=1')", id="env-of-strings"),
        pytest.param(_containers({"name": "worker", "ports": None}),
                     "containers[worker].ports must be a list", id="ports-null"),
        pytest.param(_containers({"name": "worker", "resources": {"limits": ["cpu"]}}),
                     "containers[worker].resources.limits must be a map of quantities (e.g. cpu: 500m, "
                     "memory: 1Gi) (got ['cpu'])", id="limits-a-list"),
        pytest.param(_containers({"name": "worker", "resources": {"limits": {"cpu": "lots"}}}),
                     "resources.limits must be a map of quantities", id="bad-quantity"),
        pytest.param({"spec": {"volumes": ["oops"]}},
                     "spec.template.spec.volumes[0] must be an object (got 'oops')", id="volume-a-string"),
        pytest.param({"spec": {"volumes": "oops"}}, "spec.template.spec.volumes must be a list (got 'oops')",
                     id="volumes-a-string"),
        pytest.param(_containers({"name": "side", "ports": "not-ours-to-check"}),
                     "containers[side].ports must be a list", id="sidecar-ports-a-string"),
        pytest.param({"spec": {"nodeSelector": {"rack": 3}}}, "spec.template.spec.nodeSelector must be a map "
                     "of strings (got {'rack': 3})", id="node-selector-int"),
        pytest.param({"spec": {"tolerations": [{"key": "gpu", "tolerationSeconds": True}]}},
                     "tolerations[0].tolerationSeconds must be an integer (got True)", id="bool-is-no-int"),
        pytest.param({"spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                     {"nodeSelectorTerms": {"matchFields": []}}}}}},
                     "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
                     ".nodeSelectorTerms must be a list", id="affinity-terms-an-object"),
        pytest.param(_containers({"name": "worker", "securityContext": {"capabilities": {"add": "IPC_LOCK"}}}),
                     "securityContext.capabilities.add must be a list of strings", id="capabilities-a-string"),
    ],
)  # fmt: skip
def test_check_template_names_the_field(template: dict[str, Any], expected: str) -> None:
    job = make_job(template=template)
    with pytest.raises(InvalidSpec) as raised:
        check_template(job)
    assert expected in str(raised.value)


@pytest.mark.parametrize(
    "template",
    [
        pytest.param({}, id="empty"),
        pytest.param({"spec": {"restartPolicy": "Never"}}, id="restart-never"),
        pytest.param(TEMPLATE, id="full"),
        pytest.param(_containers({"name": "side", "image": "s", "stdin": True}), id="sidecar"),
        # A field this Kubernetes does not know yet is the API server's to judge.
        pytest.param({"spec": {"futureField": {"anything": [1]}}}, id="unknown-field"),
    ],
)
def test_check_template_accepts(template: dict[str, Any]) -> None:
    check_template(make_job(template=template))


# --- the headless Service -----------------------------------------------------------------


def test_service_is_headless_without_a_selector() -> None:
    service = build_service(make_job(masterPort=23456), 0)
    assert service["metadata"]["name"] == "demo"
    assert service["metadata"]["namespace"] == NAMESPACE
    assert service["metadata"]["labels"] == {
        contract.LABEL_JOB_NAME: "demo",
        contract.LABEL_ATTEMPT: "0",
    }
    assert service["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    spec = service["spec"]
    assert spec["clusterIP"] == "None"
    assert "selector" not in spec, "kube-controller-manager must not manage its endpoints"
    assert spec["ports"] == [{"name": "rendezvous", "port": 23456, "targetPort": 23456}]


def test_endpoint_slice_names_each_worker_by_the_hostname_its_pod_carries() -> None:
    job = make_job(workers=2, masterPort=23456)
    workers = (
        Published(0, "demo-a4-worker-0", "u0", "10.0.0.5", "n1", ready=False),
        Published(1, "demo-a4-worker-1", "u1", "10.0.0.6", "", ready=True),
    )
    (endpoints,) = build_endpoint_slices(job, 4, workers, "svc-uid")
    meta = endpoints["metadata"]
    service = build_service(job, 4)["metadata"]["name"]
    assert service == "demo-a4", "each attempt has a Service, so new names, of its own"
    assert meta["name"] == service
    # CoreDNS joins a slice to its Service by this label; the attempt is read back by ours.
    assert meta["labels"]["kubernetes.io/service-name"] == service
    assert meta["labels"][contract.LABEL_ATTEMPT] == "4"
    assert meta["labels"][contract.LABEL_JOB_NAME] == "demo", "the job cache's watch selects it"
    assert meta["labels"]["endpointslice.kubernetes.io/managed-by"] != (
        "endpointslice-controller.k8s.io"
    )
    # The API server refuses a label value with a "/" (it failed every job once).
    label_value = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
    assert all(label_value.match(v) and len(v) <= 63 for v in meta["labels"].values())
    owner = meta["ownerReferences"][0]
    assert (owner["kind"], owner["uid"], owner["controller"]) == ("Service", "svc-uid", True)
    assert endpoints["addressType"] == "IPv4"
    pods = build_worker_pods(resolve_job(job), (0, 1), 4)
    for pod, endpoint in zip(pods, endpoints["endpoints"], strict=True):
        assert endpoint["hostname"] == pod["spec"]["hostname"]
        assert pod["spec"]["subdomain"] == service
        assert endpoint["targetRef"]["name"] == pod["metadata"]["name"]
    first, second = endpoints["endpoints"]
    assert first["addresses"] == ["10.0.0.5"]
    assert first["nodeName"] == "n1"
    assert "nodeName" not in second
    # Named before it is Ready: the rendezvous that makes it Ready needs the name.
    assert first["conditions"] == {"ready": True, "serving": False, "terminating": False}
    assert endpoints["ports"] == [{"name": "rendezvous", "port": 23456, "protocol": "TCP"}]
    ipv6 = (Published(0, "demo-a4-worker-0", "u0", "fd00::5", "n1", ready=True),)
    assert build_endpoint_slices(job, 4, ipv6, "svc-uid")[0]["addressType"] == "IPv6"


def test_a_job_of_over_1000_workers_is_named_by_a_slice_per_1000_ranks() -> None:
    """The API refuses a slice of more than 1,000 endpoints; a job may have 10,000."""
    job = make_job(workers=2001)
    workers = tuple(
        Published(r, f"demo-a0-worker-{r}", f"u{r}", f"10.1.{r // 250}.{r % 250 + 1}", "n", True)
        for r in range(2001)
        if r != 1500  # not addressed yet, or gone: its slice is written without it
    )
    slices = build_endpoint_slices(job, 0, workers, "svc-uid")
    assert [s["metadata"]["name"] for s in slices] == ["demo", "demo.1", "demo.2"]
    ranks = [[int(e["hostname"].rsplit("-", 1)[1]) for e in s["endpoints"]] for s in slices]
    assert ranks[0] == list(range(1000))
    assert ranks[1] == [r for r in range(1000, 2000) if r != 1500]
    assert ranks[2] == [2000]
    for s in slices:  # every one joined to the job's Service, and the job's
        assert s["metadata"]["labels"]["kubernetes.io/service-name"] == "demo"
        assert s["metadata"]["ownerReferences"][0]["name"] == "demo"
    # The set is the job's size, not its live workers': a slice whose workers are gone is
    # written empty, never left naming old addresses.
    assert [len(s["endpoints"]) for s in build_endpoint_slices(job, 1, (), "u")] == [0, 0, 0]
