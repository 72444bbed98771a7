"""A job's EndpointSlices as the API server takes them: a job may have up to 10,000 workers,
a slice at most 1,000 endpoints (builders/service.py). The job is suspended, so that an
operator running for other tests leaves it alone: it is only the owner the Service names,
and its 1,200 workers exist only as the slices name them (no topology of the integration
tests holds 1,200 pods)."""

from __future__ import annotations

import pytest
from kubernetes import config

from cluster.controlplane import Cluster
from integration.trainwave_fixtures import apply, get_json, job_manifest
from trainwave.api.trainingjob import parse_trainingjob
from trainwave.builders.service import build_endpoint_slices, build_service
from trainwave.controller.api_errors import Rejected
from trainwave.controller.kube import KubeClient
from trainwave.lifecycle.endpoints import Published

WORKERS = 1200


@pytest.fixture
def kube(cluster: Cluster) -> KubeClient:
    return KubeClient(config.new_client_from_config(str(cluster.kubeconfig)))


def test_a_job_of_1200_workers_is_named_by_two_slices_the_api_accepts(
    trainwave_installed: Cluster, namespace: str, kube: KubeClient
) -> None:
    cluster = trainwave_installed
    suspended = {"suspend": True}
    apply(cluster, namespace, job_manifest("wide", workers=WORKERS, run_policy=suspended))
    job = parse_trainingjob(get_json(cluster, namespace, "trainingjob", "wide"))
    workers = [
        Published(r, f"wide-a0-worker-{r}", f"uid-{r}", f"10.9.{r // 200}.{r % 200 + 1}", "", True)
        for r in range(WORKERS)
    ]
    service_uid = kube.apply_service(build_service(job, 0))
    whole = build_endpoint_slices(job, 0, workers, service_uid)[0]
    whole["endpoints"] = [e for s in build_endpoint_slices(job, 0, workers, service_uid)
                          for e in s["endpoints"]]  # fmt: skip
    with pytest.raises(Rejected, match="at most 1000"):  # why one slice cannot do it
        kube.apply_endpoint_slice(whole)

    for slice_ in build_endpoint_slices(job, 0, workers, service_uid):
        kube.apply_endpoint_slice(slice_)

    found = get_json(cluster, namespace, "endpointslices", "-l", "kubernetes.io/service-name=wide")
    by_name = {s["metadata"]["name"]: s for s in found["items"]}
    assert sorted(by_name) == ["wide", "wide.1"]
    assert len(by_name["wide"]["endpoints"]) == 1000
    hostnames = [e["hostname"] for s in by_name.values() for e in s["endpoints"]]
    assert sorted(hostnames) == sorted(f"wide-worker-{r}" for r in range(WORKERS))
    assert {s["metadata"]["ownerReferences"][0]["uid"] for s in by_name.values()} == {service_uid}
