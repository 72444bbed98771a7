"""The headless Service that gives every worker a stable DNS name, and its EndpointSlices.

Pure. The Service has no selector: the operator writes its EndpointSlice itself, naming
the workers lifecycle/endpoints.py publishes: as soon as worker 0 has an address (its
name is the rendezvous endpoint), once every worker of the attempt has one (not once per
worker's address), and again when a worker leaves or the attempt changes, before the new
gang's pods exist.

Why not a selector, as JobSet and Kubeflow use: kube-controller-manager's endpoint
controllers scan every pod of the namespace each time they sync a Service (client-go
cache.ListAllByNamespace), and match every pod change against every Service of the
namespace (k8s.io/endpointslice util `GetPodServiceMemberships`). With 2,000 jobs of 4
workers in one namespace the endpoint controllers took 54 % of kube-controller-manager's
CPU samples while the jobs started (docs/benchmarks/scale.md, "EndpointSlices written
by the operator"), and they also wrote a legacy Endpoints object per job. The operator already sees
every worker's address in its pod watch.

Each attempt has a Service of its own (names.service_name: `<job>`, then `<job>-a<attempt>`),
so a recreated gang's names are new and no DNS cache holds an old address for them.
Hostnames are the same in every attempt (`<job>-worker-<rank>`). The slice carries the
attempt it names (a label); when a worker leaves, the operator withdraws its address at
once, so a name never leads to a terminating pod (a SIGSTOPped process holds it for the
whole grace period: in the fault benchmark a new gang's workers waited for a dead address).
The previous attempt's Service is deleted when the next gang is created; garbage
collection takes its slices.

A slice holds at most 1,000 endpoints (k8s.io/kubernetes pkg/apis/discovery/validation,
`maxEndpoints`), and a job may have up to 10,000 workers: ranks 0-999 are named by the
slice that has the Service's name, ranks 1000-1999 by `<service>.1`, and so on. The set of
slices is fixed by the job's size, so a slice is written again (emptied, if its workers are
gone), never left behind. A "." cannot appear in a job's name, so no other job's slice can
take these names.
"""

from collections.abc import Sequence
from typing import Any, Protocol

from trainwave import contract
from trainwave.api.trainingjob import TrainingJob
from trainwave.builders.names import service_name, worker_hostname
from trainwave.builders.owners import job_labels, owner_reference

# The label kube-proxy and CoreDNS join an EndpointSlice to its Service by, and the one
# that tells kube-controller-manager's controllers the slice is not theirs
# (discovery.k8s.io/v1 LabelServiceName, LabelManagedBy).
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
MANAGED_BY_LABEL = "endpointslice.kubernetes.io/managed-by"
MANAGED_BY = "trainwave.io"  # a label value: no "/"
SLICE_CAPACITY = 1000  # endpoints in one EndpointSlice, the API's limit


class Named(Protocol):
    """A worker the slice names (lifecycle/endpoints.py `Published`)."""

    @property
    def rank(self) -> int: ...
    @property
    def pod(self) -> str: ...
    @property
    def uid(self) -> str: ...
    @property
    def address(self) -> str: ...
    @property
    def node(self) -> str: ...
    @property
    def ready(self) -> bool: ...


def build_service(job: TrainingJob, attempt: int) -> dict[str, Any]:
    port = job.spec.master_port
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": service_name(job.metadata.name, attempt),
            "namespace": job.metadata.namespace,
            "labels": {**job_labels(job.metadata), contract.LABEL_ATTEMPT: str(attempt)},
            "ownerReferences": [owner_reference(job.metadata)],
        },
        "spec": {
            "clusterIP": "None",
            "ports": [
                {"name": contract.MASTER_PORT_NAME, "port": port, "targetPort": port},
            ],
        },
    }


def slice_name(job: str, attempt: int, index: int) -> str:
    """The name of the attempt's `index`th EndpointSlice: the first has the Service's."""
    name = service_name(job, attempt)
    return f"{name}.{index}" if index else name


def build_endpoint_slices(
    job: TrainingJob, attempt: int, workers: Sequence[Named], service_uid: str
) -> list[dict[str, Any]]:
    """The slices naming `workers`, owned by the Service (`service_uid`) as
    kube-controller-manager's own slices are: deleting the Service deletes them. One per
    SLICE_CAPACITY ranks of the job, each naming the workers of its ranks."""
    count = max(1, -(-job.spec.workers // SLICE_CAPACITY))
    ipv6 = any(":" in w.address for w in workers)
    by_slice = [[w for w in workers if w.rank // SLICE_CAPACITY == i] for i in range(count)]
    return [
        _slice(job, attempt, i, named, ipv6=ipv6, service_uid=service_uid)
        for i, named in enumerate(by_slice)
    ]


def _slice(
    job: TrainingJob,
    attempt: int,
    index: int,
    workers: Sequence[Named],
    *,
    ipv6: bool,
    service_uid: str,
) -> dict[str, Any]:
    service = service_name(job.metadata.name, attempt)
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": slice_name(job.metadata.name, attempt, index),
            "namespace": job.metadata.namespace,
            "labels": {
                **job_labels(job.metadata),
                contract.LABEL_ATTEMPT: str(attempt),
                SERVICE_NAME_LABEL: service,
                MANAGED_BY_LABEL: MANAGED_BY,
            },
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Service",
                    "name": service,
                    "uid": service_uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        # One address type for every slice of the job: CoreDNS answers a name from
        # whichever slice holds it, and a job's pods share their cluster's family.
        "addressType": "IPv6" if ipv6 else "IPv4",
        "endpoints": [_endpoint(job, w) for w in workers],
        "ports": [
            {"name": contract.MASTER_PORT_NAME, "port": job.spec.master_port, "protocol": "TCP"}
        ],
    }


def _endpoint(job: TrainingJob, worker: Named) -> dict[str, Any]:
    endpoint: dict[str, Any] = {
        "addresses": [worker.address],
        "hostname": worker_hostname(job.metadata.name, worker.rank),
        # Ready before the pod is: publishNotReadyAddresses, as lifecycle/endpoints.py says.
        "conditions": {"ready": True, "serving": worker.ready, "terminating": False},
        "targetRef": {
            "kind": "Pod",
            "namespace": job.metadata.namespace,
            "name": worker.pod,
            "uid": worker.uid,
        },
    }
    if worker.node:
        endpoint["nodeName"] = worker.node
    return endpoint
