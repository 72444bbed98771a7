"""Worker 0's name is published as soon as its pod has an address, before the other
workers have theirs (lifecycle/endpoints.py `host_unpublished`): every other worker's
torchrun asks for that name first, and an answer of NXDOMAIN would stay in CoreDNS's cache.

The gang runs on two nodes no kwok plays, so no pod gets an address until the test writes
one into its status, as a kubelet would once the pod's sandbox has its network.
"""

import json

import pytest

from integration.node_pools import node_pool
from integration.trainwave_fixtures import apply, get_json, job_manifest, wait_until, worker_pods
from trainwave.contract import LABEL_RANK

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def named(cluster, namespace, service):
    slices = get_json(cluster, namespace, "endpointslices",
                      "-l", f"kubernetes.io/service-name={service}")["items"]  # fmt: skip
    return sorted(
        (e["targetRef"]["name"], e["addresses"][0])
        for s in slices
        for e in s.get("endpoints") or []
    )


def give_address(cluster, namespace, pod: str, address: str) -> None:
    status = {"status": {"podIP": address, "podIPs": [{"ip": address}]}}
    cluster.kubectl("patch", "pod", pod, "-n", namespace, "--subresource=status",
                    "--type=merge", "-p", json.dumps(status))  # fmt: skip


def test_worker_0_is_named_before_the_other_workers_have_addresses(
    cluster, namespace, running_operator
):
    with node_pool(cluster, rack_sizes=(2,), played=False) as pool:
        spec = {"nodeSelector": pool.selector}
        apply(cluster, namespace,
              job_manifest("early", workers=2, gpus=8, result=None, template_spec=spec))  # fmt: skip

        def bound():
            pods = worker_pods(cluster, namespace, "early")
            placed = len(pods) == 2 and all(p["spec"].get("nodeName") for p in pods)
            return pods if placed else None

        pods = wait_until(bound, 30, "both workers bound")
        by_rank = {p["metadata"]["labels"][LABEL_RANK]: p["metadata"]["name"] for p in pods}
        worker_0, worker_1 = by_rank["0"], by_rank["1"]
        assert named(cluster, namespace, "early") == []

        give_address(cluster, namespace, worker_0, "10.77.0.10")
        first = wait_until(lambda: named(cluster, namespace, "early"), 15, "worker 0 named")
        assert first == [(worker_0, "10.77.0.10")], "worker 1 has no address yet"

        give_address(cluster, namespace, worker_1, "10.77.0.11")
        both = [(worker_0, "10.77.0.10"), (worker_1, "10.77.0.11")]
        wait_until(lambda: named(cluster, namespace, "early") == both or None, 15, "both named")
