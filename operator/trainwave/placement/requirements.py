"""What one pod asks of a node, read from the pod object as stored. Pure.

`pod_needs(pod)` turns a pod into the hashable `PodNeeds` the filters
(filters.py) test nodes against. It reads the pod the API server stored, not the
TrainingJob's template: admission adds to a pod (DefaultTolerationSeconds adds
NoExecute tolerations, LimitRanger adds requests), and kube-scheduler sees the
stored pod. `trainwave plan`, which has no stored pod, builds the pod and adds
what admission would (`with_default_tolerations`).

The request follows component-helpers `resource.PodRequests` (v0.34): the sum of
the containers; init containers taken in order, each needing its own request
plus the sidecars (restartPolicy: Always) declared before it, sidecars also
adding to the running sum; the larger of the two; pod-level `resources.requests`
for cpu, memory and hugepages replacing the aggregate; plus `overhead`. API
defaulting copies a limit into a missing request (`SetDefaults_Pod`); a stored
pod already has it, a built one gets it here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from trainwave.placement.quantities import CPU, MEMORY, amounts

# DefaultTolerationSeconds admission: every pod tolerates these NoExecute taints
# for 300 s unless it says otherwise (k/k plugin/pkg/admission/defaulttolerationseconds).
NOT_READY_TAINT: Final = "node.kubernetes.io/not-ready"
UNREACHABLE_TAINT: Final = "node.kubernetes.io/unreachable"
UNSCHEDULABLE_TAINT: Final = "node.kubernetes.io/unschedulable"
DEFAULT_TOLERATION_SECONDS: Final = 300


@dataclass(frozen=True, slots=True)
class Toleration:
    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""

    def tolerates(self, taint: Taint) -> bool:
        """api core/v1 `Toleration.ToleratesTaint`: effect, key, then operator."""
        if self.effect and self.effect != taint.effect:
            return False
        if self.key and self.key != taint.key:
            return False
        if self.operator == "Exists":
            return True  # an empty key with Exists tolerates every taint
        if self.operator in ("", "Equal"):
            return bool(self.key) and self.value == taint.value
        return False  # any other operator never matches


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str = ""
    effect: str = "NoSchedule"

    def __str__(self) -> str:
        return f"{{{self.key}: {self.value}}}" if self.value else f"{{{self.key}}}"


@dataclass(frozen=True, slots=True)
class Requirement:
    """One matchExpressions/matchFields entry of a node selector term."""

    key: str
    operator: str
    values: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Term:
    """A node selector term: its requirements are ANDed."""

    expressions: tuple[Requirement, ...] = ()
    fields: tuple[Requirement, ...] = ()

    @property
    def empty(self) -> bool:
        return not self.expressions and not self.fields


HostPort = tuple[str, str, int]  # (hostIP, protocol, port)


@dataclass(frozen=True, slots=True)
class PodNeeds:
    """Everything the filters ask of a node for one pod. Hashable: memo keys use it."""

    requests: tuple[tuple[str, int], ...] = ()  # sorted (resource, amount)
    tolerations: tuple[Toleration, ...] = ()
    node_selector: tuple[tuple[str, str], ...] = ()
    required_terms: tuple[Term, ...] | None = None  # None: no required node affinity
    preferred_terms: tuple[tuple[int, Term], ...] = ()  # (weight, term), a soft score
    host_ports: tuple[HostPort, ...] = ()
    node_name: str = ""  # spec.nodeName, which a gated pod cannot have

    @property
    def request(self) -> dict[str, int]:
        return dict(self.requests)

    def amount(self, resource: str) -> int:
        for name, value in self.requests:
            if name == resource:
                return value
        return 0


def pod_needs(pod: Mapping[str, Any]) -> PodNeeds:
    """A pod's needs; raises ValueError (BadQuantity) for a quantity the API would refuse."""
    spec = pod.get("spec") or {}
    affinity = ((spec.get("affinity") or {}).get("nodeAffinity")) or {}
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    terms = None
    if required is not None:
        terms = tuple(_term(t) for t in required.get("nodeSelectorTerms") or ())
    preferred = tuple(
        (int(p.get("weight") or 0), _term(p.get("preference") or {}))
        for p in affinity.get("preferredDuringSchedulingIgnoredDuringExecution") or ()
    )
    return PodNeeds(
        requests=tuple(sorted(pod_requests(spec).items())),
        tolerations=tuple(_toleration(t) for t in spec.get("tolerations") or ()),
        node_selector=tuple(sorted((spec.get("nodeSelector") or {}).items())),
        required_terms=terms,
        preferred_terms=preferred,
        host_ports=host_ports(spec),
        node_name=str(spec.get("nodeName") or ""),
    )


def with_default_tolerations(needs: PodNeeds) -> PodNeeds:
    """What DefaultTolerationSeconds admission adds to a pod that lacks them."""
    added = []
    for key in (NOT_READY_TAINT, UNREACHABLE_TAINT):
        if not any(t.key == key and t.effect in ("", "NoExecute") for t in needs.tolerations):
            added.append(Toleration(key, "Exists", "", "NoExecute"))
    if not added:
        return needs
    return PodNeeds(
        needs.requests,
        (*needs.tolerations, *added),
        needs.node_selector,
        needs.required_terms,
        needs.preferred_terms,
        needs.host_ports,
        needs.node_name,
    )


def pod_requests(spec: Mapping[str, Any]) -> dict[str, int]:
    """component-helpers `resource.PodRequests`, in kube-scheduler's units."""
    running: dict[str, int] = {}
    for container in spec.get("containers") or ():
        _add(running, container_requests(container))
    init_peak: dict[str, int] = {}
    sidecars: dict[str, int] = {}
    for container in spec.get("initContainers") or ():
        own = container_requests(container)
        if container.get("restartPolicy") == "Always":
            _add(running, own)
            _add(sidecars, own)
            needed = dict(sidecars)
        else:
            needed = dict(sidecars)
            _add(needed, own)
        _max(init_peak, needed)
    _max(running, init_peak)
    pod_level = amounts(((spec.get("resources") or {}).get("requests")) or {})
    for name, value in pod_level.items():
        if name in (CPU, MEMORY) or name.startswith("hugepages-"):
            running[name] = value
    _add(running, amounts(spec.get("overhead") or {}))
    return {name: value for name, value in running.items() if value > 0}


def container_requests(container: Mapping[str, Any]) -> dict[str, int]:
    resources = container.get("resources") or {}
    limits = resources.get("limits") or {}
    requests = resources.get("requests") or {}
    # API defaulting: a limit without a request sets the request.
    return amounts({**limits, **requests})


def host_ports(spec: Mapping[str, Any]) -> tuple[HostPort, ...]:
    """(hostIP, protocol, port) of every container and sidecar that asks for a host port.

    With hostNetwork, API defaulting sets each containerPort's hostPort to itself.
    """
    found = []
    containers = list(spec.get("containers") or ())
    containers += [
        c for c in spec.get("initContainers") or () if c.get("restartPolicy") == "Always"
    ]
    for container in containers:
        for port in container.get("ports") or ():
            number = port.get("hostPort") or (
                port.get("containerPort") if spec.get("hostNetwork") else None
            )
            if number:
                found.append(
                    (
                        str(port.get("hostIP") or "0.0.0.0"),
                        str(port.get("protocol") or "TCP"),
                        int(number),
                    )
                )
    return tuple(sorted(set(found)))


def _term(raw: Mapping[str, Any]) -> Term:
    return Term(
        tuple(_requirement(r) for r in raw.get("matchExpressions") or ()),
        tuple(_requirement(r) for r in raw.get("matchFields") or ()),
    )


def _requirement(raw: Mapping[str, Any]) -> Requirement:
    return Requirement(
        str(raw.get("key") or ""),
        str(raw.get("operator") or ""),
        tuple(str(v) for v in raw.get("values") or ()),
    )


def _toleration(raw: Mapping[str, Any]) -> Toleration:
    return Toleration(
        str(raw.get("key") or ""),
        str(raw.get("operator") or "Equal"),
        str(raw.get("value") or ""),
        str(raw.get("effect") or ""),
    )


def _add(total: dict[str, int], more: Mapping[str, int]) -> None:
    for name, value in more.items():
        total[name] = total.get(name, 0) + value


def _max(total: dict[str, int], other: Mapping[str, int]) -> None:
    for name, value in other.items():
        total[name] = max(total.get(name, 0), value)


def taints_of(raw: Iterable[Mapping[str, Any]] | None) -> tuple[Taint, ...]:
    return tuple(
        Taint(str(t.get("key") or ""), str(t.get("value") or ""), str(t.get("effect") or ""))
        for t in raw or ()
    )
