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

Topology spread constraints follow k/k pkg/scheduler/framework/plugins/
podtopologyspread/common.go (`filterTopologySpreadConstraints`): a nil
labelSelector matches nothing, an empty one everything; `matchLabelKeys` adds
`key In (the pod's value)` for each key the pod carries (the API server may have
merged them already, and the same requirement twice changes nothing);
nodeAffinityPolicy defaults to Honor, nodeTaintsPolicy to Ignore.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
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


def label_requirement_matches(requirement: Requirement, labels: Mapping[str, str]) -> bool:
    """apimachinery labels.Requirement.Matches for the selector and node-affinity operators."""
    key, operator, values = requirement.key, requirement.operator, requirement.values
    present = key in labels
    value = labels.get(key, "")
    if operator == "In":
        return present and value in values
    if operator == "NotIn":
        return not present or value not in values
    if operator == "Exists":
        return present
    if operator == "DoesNotExist":
        return not present
    if operator in ("Gt", "Lt"):
        if not present or len(values) != 1:
            return False
        try:
            have, bound = int(value), int(values[0])
        except ValueError:
            return False  # a parse error fails only its own term
        return have > bound if operator == "Gt" else have < bound
    return False


@dataclass(frozen=True, slots=True)
class LabelSelector:
    """A metav1.LabelSelector: matchLabels and matchExpressions, all ANDed."""

    expressions: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(label_requirement_matches(r, labels) for r in self.expressions)


@dataclass(frozen=True, slots=True)
class SpreadConstraint:
    """One topologySpreadConstraints entry of the pod, as kube-scheduler reads it."""

    max_skew: int
    topology_key: str
    hard: bool  # whenUnsatisfiable: DoNotSchedule (a filter); else ScheduleAnyway (a score)
    selector: LabelSelector | None  # None: a nil selector, which matches no pod
    min_domains: int = 1
    honor_affinity: bool = True  # nodeAffinityPolicy
    honor_taints: bool = False  # nodeTaintsPolicy
    self_match: bool = False  # the pod's own labels match the selector


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
    spread: tuple[SpreadConstraint, ...] = ()  # the pod's topologySpreadConstraints
    # Only with spread constraints (so pods without them share one memo key): the pod's
    # namespace and labels, which count toward its constraints once it is placed.
    namespace: str = ""
    labels: tuple[tuple[str, str], ...] = ()

    @property
    def hard_spread(self) -> tuple[SpreadConstraint, ...]:
        return tuple(c for c in self.spread if c.hard)

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
    metadata = pod.get("metadata") or {}
    labels = {str(k): str(v) for k, v in (metadata.get("labels") or {}).items()}
    spread = tuple(_spread(c, labels) for c in spec.get("topologySpreadConstraints") or () if c)
    return PodNeeds(
        requests=tuple(sorted(pod_requests(spec).items())),
        tolerations=tuple(_toleration(t) for t in spec.get("tolerations") or ()),
        node_selector=tuple(sorted((spec.get("nodeSelector") or {}).items())),
        required_terms=terms,
        preferred_terms=preferred,
        host_ports=host_ports(spec),
        node_name=str(spec.get("nodeName") or ""),
        spread=spread,
        namespace=str(metadata.get("namespace") or "") if spread else "",
        labels=tuple(sorted(labels.items())) if spread else (),
    )


def _spread(raw: Mapping[str, Any], labels: Mapping[str, str]) -> SpreadConstraint:
    selector = raw.get("labelSelector")
    parsed = None
    if selector is not None:
        expressions = [
            Requirement(str(k), "In", (str(v),))
            for k, v in sorted((selector.get("matchLabels") or {}).items())
        ]
        expressions += [_requirement(r) for r in selector.get("matchExpressions") or ()]
        expressions += [
            Requirement(key, "In", (labels[key],))
            for key in raw.get("matchLabelKeys") or ()
            if key in labels
        ]
        parsed = LabelSelector(tuple(expressions))
    return SpreadConstraint(
        max_skew=int(raw.get("maxSkew") or 1),
        topology_key=str(raw.get("topologyKey") or ""),
        hard=raw.get("whenUnsatisfiable", "DoNotSchedule") == "DoNotSchedule",
        selector=parsed,
        min_domains=int(raw.get("minDomains") or 1),
        honor_affinity=raw.get("nodeAffinityPolicy", "Honor") == "Honor",
        honor_taints=raw.get("nodeTaintsPolicy", "Ignore") == "Honor",
        self_match=parsed is not None and parsed.matches(labels),
    )


def with_default_tolerations(needs: PodNeeds) -> PodNeeds:
    """What DefaultTolerationSeconds admission adds to a pod that lacks them."""
    added = []
    for key in (NOT_READY_TAINT, UNREACHABLE_TAINT):
        if not any(t.key == key and t.effect in ("", "NoExecute") for t in needs.tolerations):
            added.append(Toleration(key, "Exists", "", "NoExecute"))
    if not added:
        return needs
    return replace(needs, tolerations=(*needs.tolerations, *added))


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
