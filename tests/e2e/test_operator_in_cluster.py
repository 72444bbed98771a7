"""The chart as a platform team installs it, running as containers on a real node.

Two operator replicas from `trainwave/operator:0.1.0` run in-cluster (the kubelet mounts
their ServiceAccount token; nothing is handed a kubeconfig) under the chart's security
context, elect a leader on the Lease, hand it over when the leader's pod is deleted or its
container killed, and the new leader runs jobs. The agent's DaemonSet pod runs on the real
node and labels its own Node from the fake-GPU file (no GPU here). `kubectl logs` reaches
the operator's output through the real kubelet.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from e2e.conftest import FAKE_GPU_PRODUCT, Release
from integration.trainwave_fixtures import apply, job_manifest, wait_for_phase, wait_until
from trainwave import contract
from trainwave.agent.labels import product_label

pytestmark = pytest.mark.timeout(300)

KWOK_NODES = {"type": "kwok"}


def pod_ready(pod: dict[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def exec_python(release: Release, pod: str, code: str) -> tuple[int, str]:
    result = release.cluster.kubectl(
        "exec", pod, "-n", release.namespace, "-c", "operator", "--", "python", "-c", code,
        check=False,
    )  # fmt: skip
    return result.returncode, (result.stdout + result.stderr).strip()


def holder_pod(release: Release, pods: list[str]) -> str:
    """The operator pod whose name prefixes the Lease's holderIdentity ('' if none)."""
    identity = release.leader()
    return next((pod for pod in pods if identity.startswith(f"{pod}_")), "")


def test_two_operator_pods_run_in_cluster_and_one_holds_the_lease(release: Release) -> None:
    pods = release.operator_pods()

    assert len(pods) == 2, [p["metadata"]["name"] for p in pods]
    assert all(pod_ready(p) for p in pods)
    assert {p["spec"]["nodeName"] for p in pods} == {release.node}
    names = [p["metadata"]["name"] for p in pods]
    assert holder_pod(release, names), f"Lease holder {release.leader()!r} is none of {names}"
    # The chart's security context, as the container actually runs it.
    name = names[0]
    code, uid = exec_python(release, name, "import os; print(os.getuid(), os.getgid())")
    assert (code, uid) == (0, "65532 65532")
    # Read-only root: the mount's options, since as user 65532 a write would fail anyway.
    code, said = exec_python(
        release, name,
        "print(next(line.split()[3] for line in open('/proc/self/mounts') "
        "if line.split()[1] == '/').split(',')[0])",
    )  # fmt: skip
    assert (code, said) == (0, "ro")
    # In-cluster config: the token the kubelet projected, not a kubeconfig.
    code, said = exec_python(
        release, name,
        "import os; print(os.environ.get('KUBECONFIG', '-'), "
        "os.path.exists('/var/run/secrets/kubernetes.io/serviceaccount/token'))",
    )  # fmt: skip
    assert (code, said) == (0, "- True")
    container = pods[0]["spec"]["containers"][0]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/healthz"


def test_operator_logs_come_through_the_kubelet(release: Release) -> None:
    names = [p["metadata"]["name"] for p in release.operator_pods()]
    leader = holder_pod(release, names)

    logs = release.cluster.kubectl("logs", leader, "-n", release.namespace, "-c", "operator")

    assert "became leader" in logs.stdout, logs.stdout[-2000:]


def test_agent_runs_on_the_real_node_and_labels_it(release: Release) -> None:
    agent = release.agent_pod()
    assert agent["spec"]["nodeName"] == release.node
    assert pod_ready(agent)

    def labelled() -> dict[str, Any] | None:
        node = json.loads(release.cluster.kubectl("get", "node", release.node, "-o", "json").stdout)
        labels = node["metadata"]["labels"]
        wrote = labels.get(contract.NODE_LABEL_GPU_PRODUCT) == product_label(FAKE_GPU_PRODUCT)
        return node if wrote else None

    node = wait_until(labelled, 90, f"the agent's labels on {release.node}")
    labels, annotations = node["metadata"]["labels"], node["metadata"]["annotations"]
    gpus = release.fake_gpus["gpus"]
    assert labels[contract.NODE_LABEL_GPU_COUNT] == str(len(gpus))
    assert labels[contract.NODE_LABEL_GPU_MEMORY] == str(gpus[0]["memoryMiB"])
    assert labels[contract.NODE_LABEL_NVLINK_DOMAIN]
    # What it wrote is recorded, so a later pass can take back what it no longer finds.
    assert contract.NODE_LABEL_GPU_PRODUCT in annotations[contract.ANNOTATION_AGENT_LABELS]
    inventory = annotations[contract.ANNOTATION_INVENTORY]
    assert all(gpu["uuid"] in inventory for gpu in gpus), inventory[:500]


def test_deleting_the_leader_pod_hands_the_lease_over(release: Release, namespace: str) -> None:
    before = [p["metadata"]["name"] for p in release.operator_pods()]
    leader = holder_pod(release, before)
    assert leader, f"no operator pod holds the Lease ({release.leader()!r})"
    (standby,) = [name for name in before if name != leader]

    release.cluster.kubectl("delete", "pod", leader, "-n", release.namespace, "--wait=false")

    # The leader releases the Lease when it stops (SIGTERM from the kubelet). Any candidate
    # may then take it: usually the standby, sometimes the Deployment's replacement pod,
    # which starts meanwhile and races the standby (client-go's elector makes no promise
    # either). What matters is that a live replica leads, well within the lease bound.
    def new_holder() -> str:
        live = [p["metadata"]["name"] for p in release.operator_pods() if pod_ready(p)]
        holder = holder_pod(release, live)
        return holder if holder and holder != leader else ""

    holder = wait_until(new_holder, 60, f"a live replica other than {leader} (standby: {standby}) "
                        "to hold the Lease")  # fmt: skip
    assert holder != leader
    # A job applied now runs under the new leader (on kwok nodes: the simulation runs it).
    apply(release.cluster, namespace,
          job_manifest("after-handover", workers=2, template_spec={"nodeSelector": KWOK_NODES}))  # fmt: skip
    done = wait_for_phase(release.cluster, namespace, "after-handover", ("Succeeded", "Failed"))
    assert done["status"]["phase"] == "Succeeded", done["status"]
    # The Deployment replaces the deleted pod, back to two Ready replicas for the next tests.
    wait_until(
        lambda: len(pods := release.operator_pods()) == 2 and all(pod_ready(p) for p in pods),
        120, "two Ready operator pods again",
    )  # fmt: skip
    assert leader not in [p["metadata"]["name"] for p in release.operator_pods()]
    assert {p["spec"]["nodeName"] for p in release.operator_pods()} == {release.node}


def test_a_killed_leader_container_comes_back_as_the_leader_at_once(
    release: Release, namespace: str
) -> None:
    """SIGKILL, no goodbye: nothing releases the Lease. The kubelet restarts the container in
    the same pod, and the new process takes over a Lease held by an earlier run of its own
    pod at once (kube/leadership.py) instead of after leaseDuration (15 s); were it
    slower than the Lease, the standby would take it by then (the chart's bound: 17.4 s)."""
    names = [p["metadata"]["name"] for p in release.operator_pods()]
    identity, leader = release.leader(), holder_pod(release, names)
    assert leader, f"no operator pod holds the Lease ({identity!r})"
    container = release.container_id(release.namespace, leader, "operator")

    began = time.monotonic()
    release.crictl("stop", "--timeout", "0", container)

    wait_until(lambda: release.leader() not in ("", identity), 60,
               f"a new holder of the Lease {identity} held")  # fmt: skip
    took, holder = time.monotonic() - began, release.leader()
    if holder.startswith(f"{leader}_"):
        assert took < 15, f"{leader}'s restarted container took the Lease after {took:.1f}s"
    else:
        assert took < 30, f"the standby took the Lease {took:.1f}s after the leader was killed"
    apply(release.cluster, namespace,
          job_manifest("after-kill", workers=2, template_spec={"nodeSelector": KWOK_NODES}))  # fmt: skip
    done = wait_for_phase(release.cluster, namespace, "after-kill", ("Succeeded", "Failed"))
    assert done["status"]["phase"] == "Succeeded", done["status"]
    restarted = next(p for p in release.operator_pods() if p["metadata"]["name"] == leader)
    assert restarted["status"]["containerStatuses"][0]["restartCount"] >= 1
    wait_until(
        lambda: len(pods := release.operator_pods()) == 2 and all(pod_ready(p) for p in pods),
        120, "two Ready operator pods again",
    )  # fmt: skip
