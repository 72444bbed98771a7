"""Which workers the job's DNS names point at: the endpoints the operator publishes.

Pure. The operator writes its headless Service's EndpointSlice itself
(builders/service.py says why). What it publishes follows kube-controller-manager's
EndpointSlice controller for a headless Service with publishNotReadyAddresses
(k8s.io/endpointslice util/controller_utils.go `ShouldPodBeInEndpoints`, utils.go
`podToEndpoint`): a pod with an address that has not ended, published ready before it is
Ready (readiness comes only after the rendezvous that needs the name), with one
difference: a terminating pod is left out. A worker replaced alone keeps its hostname, so
kube-controller-manager published the old, terminating pod's address beside the new one's
under the same name; here only the current attempt's live workers are named, and the new
pod is named as soon as it has an address, while the old one may still terminate.
"""

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

from trainwave.lifecycle.observed import PodPhase, WorkerPod

# What the published endpoints are, compared with what a watch shows: (pod, address).
Addresses = frozenset[tuple[str, str]]
# An EndpointSlice as the operator reads it back: the attempt it names, and its addresses.
ServiceState = tuple[int, Addresses]
# The attempt of a slice another controller manages: never current, so the operator writes
# its own and deletes that one (controller/executing.py).
FOREIGN = -2


@dataclass(frozen=True, slots=True)
class Published:
    """One worker as its EndpointSlice names it."""

    rank: int
    pod: str
    uid: str
    address: str
    node: str
    ready: bool


def published(pods: Iterable[WorkerPod], attempt: int) -> tuple[Published, ...]:
    """The workers of `attempt` that DNS should name, by rank; of two live pods of one
    rank (an old pod whose delete has not reached the API yet), the newest replacement."""
    chosen = {
        p.rank: Published(p.rank, p.name, p.uid, p.pod_ip, p.node, p.ready)
        for p in sorted(pods, key=lambda p: p.serial)
        if p.attempt == attempt
        and nameable(p.pod_ip)
        and not p.deleting
        and not p.departed
        and p.phase not in (PodPhase.SUCCEEDED, PodPhase.FAILED)
    }
    return tuple(chosen[rank] for rank in sorted(chosen))


def nameable(address: str) -> bool:
    """An address an EndpointSlice may hold: the API server refuses unspecified, loopback
    and link-local ones (pkg/apis/core/validation `ValidateEndpointIP`), which no peer could
    reach by name anyway (a host-network worker of a test kubelet has 127.0.0.1)."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    link_local_multicast = ip in ipaddress.ip_network(
        "224.0.0.0/24" if ip.version == 4 else "ff02::/16"
    )
    return not (ip.is_unspecified or ip.is_loopback or ip.is_link_local or link_local_multicast)


def addresses(endpoints: Iterable[Published]) -> Addresses:
    return frozenset((e.pod, e.address) for e in endpoints)


def service_state(
    states: Iterable[ServiceState], attempt: int, wanted: Addresses, applied: bool
) -> tuple[bool, bool]:
    """(current, stale) for a job whose attempt is `attempt` and whose live workers are
    `wanted`, given the EndpointSlices the watch shows (`states`) and whether this
    reconciler applied exactly (attempt, wanted) moments ago (`applied`).

    Current: the names point at exactly the live workers. Stale: a slice names another
    attempt or an address no longer live, or another controller's slice is there; it is
    written again at once, before the new workers exist. Neither: workers are still
    getting their addresses; the slice is written once worker 0 has one and once all have
    one (lifecycle/decide.py, `host_unpublished`), not once per address."""
    states = list(states)
    foreign = any(a == FOREIGN for a, _ in states)
    current = not foreign and (applied or (attempt, wanted) in states)
    stale = not current and any(a != attempt or not named <= wanted for a, named in states)
    return current, stale


def host_unpublished(
    states: Iterable[ServiceState],
    attempt: int,
    workers: Iterable[Published],
    in_flight: ServiceState | None = None,
) -> bool:
    """Whether worker 0 of `attempt` has an address that no slice of that attempt names
    yet, neither one the watch shows nor `in_flight` (applied moments ago, not seen yet).

    Its name is the one every other worker's torchrun asks for first (the c10d rendezvous
    endpoint), and a name asked before any slice names it is answered NXDOMAIN, which
    CoreDNS then caches (30 s with kubeadm's Corefile; docs/benchmarks/faults.md measures it).
    So worker 0 is published as soon as it has an address, with whichever workers have
    theirs, rather than once all have one; the rest follow in one more write. A gang whose
    workers get their addresses together is still written once."""
    host = next(((w.pod, w.address) for w in workers if w.rank == 0), None)
    if host is None:
        return False
    named = [n for a, n in states if a == attempt]
    if in_flight is not None and in_flight[0] == attempt:
        named.append(in_flight[1])
    return not any(host in n for n in named)


def foreign(states: Iterable[ServiceState]) -> bool:
    return any(a == FOREIGN for a, _ in states)
