"""Whether a worker pod reaches the store exactly as the operator built it.

A gang is placed before its pods exist (placer.place_now) only when nothing on the
way in can change a pod's needs or refuse part of the gang; otherwise its pods are
created behind the gate, and placed from the stored pods, as always. What could:

- a mutating admission webhook whose rules match pod CREATE (it may add requests,
  tolerations, selectors, a gate), whatever its namespace and object selectors say:
  while one exists, the gang's first placed pod is created as a server-side dry run
  first, and only a gang whose pod comes back with the needs it was placed with is
  created placed (executing.py). Kueue's release installs such a webhook for every
  namespace but two, even with its pod integration off;
- a LimitRange in the namespace (the LimitRanger plugin fills in default requests);
- a ResourceQuota in the namespace (it may admit some workers of a gang and refuse
  the rest, which would leave part of a gang running);
- a RuntimeClass on the pod (its overhead is added to the requests): the caller
  checks the pod.

The built-in plugins' other changes are known and applied before placing
(placement_inputs.with_admission_defaults). Three informers (kube/informer.py)
keep this from watches; until all three are listed, or while one cannot be read
(RBAC), every gang takes the gate.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from functools import partial
from typing import Any

from trainwave.controller.kube import KubeClient
from trainwave.kube.informer import (
    PAGE_SIZE,
    WATCH_SECONDS,
    Informer,
    InformerGroup,
    LockedDict,
)
from trainwave.kube.namespaced import AnyInformer, informer_in

_POD_RESOURCES = {"pods", "*", "*/*"}


class AdmissionGuards(InformerGroup):
    """`namespaces`: the operator's --namespace; LimitRanges and ResourceQuotas matter
    only where its jobs are, so with names they are watched only there (kube/namespaced.py).
    Webhook configurations are cluster-scoped: watched cluster-wide."""

    def __init__(
        self,
        kube: KubeClient,
        *,
        namespaces: Iterable[str] = (),
        page_size: int = PAGE_SIZE,
        watch_seconds: int = WATCH_SECONDS,
    ):
        self._lock = threading.Lock()
        self._webhooks, self._limits, self._quotas = (LockedDict[str](self._lock) for _ in range(3))
        common: dict[str, Any] = {"page_size": page_size, "watch_seconds": watch_seconds}
        core = kube.core
        self._informers: tuple[AnyInformer[str], ...] = (
            Informer(
                "mutatingwebhookconfigurations",
                kube.admission.list_mutating_webhook_configuration,
                mutates_pods,
                self._webhooks,
                **common,
            ),
            informer_in(
                "limitranges",
                namespaces,
                everywhere=core.list_limit_range_for_all_namespaces,
                lister_in=lambda ns: partial(core.list_namespaced_limit_range, ns),
                convert=_namespace,
                store=self._limits,
                **common,
            ),
            informer_in(
                "resourcequotas",
                namespaces,
                everywhere=core.list_resource_quota_for_all_namespaces,
                lister_in=lambda ns: partial(core.list_namespaced_resource_quota, ns),
                convert=_namespace,
                store=self._quotas,
                **common,
            ),
        )

    @property
    def informers(self) -> tuple[AnyInformer[str], ...]:
        return self._informers

    def blocker(self, namespace: str) -> str:
        """What keeps a pod created in `namespace` from being placed before it exists;
        "" when nothing does (webhooks aside: `pod_webhooks`)."""
        unlisted = [i.kind for i in self.informers if not i.synced]
        if unlisted:
            return f"not listed yet: {', '.join(unlisted)}"
        with self._lock:
            limits = namespace in self._limits.records.values()
            quotas = namespace in self._quotas.records.values()
        if limits:
            return f"a LimitRange in namespace {namespace}"
        if quotas:
            return f"a ResourceQuota in namespace {namespace}"
        return ""

    def pod_webhooks(self) -> list[str]:
        """The mutating webhook configurations that may change a pod being created."""
        with self._lock:
            return sorted(self._webhooks.records)


def mutates_pods(configuration: Mapping[str, Any]) -> str | None:
    """The configuration's name if one of its webhooks may mutate a pod being created."""
    for webhook in configuration.get("webhooks") or ():
        if any(_matches_pod_create(rule) for rule in webhook.get("rules") or ()):
            return str((configuration.get("metadata") or {}).get("name") or "")
    return None


def _matches_pod_create(rule: Mapping[str, Any]) -> bool:
    return (
        _has(rule.get("apiGroups"), "")
        and _has(rule.get("operations"), "CREATE")
        and bool(_POD_RESOURCES & set(rule.get("resources") or ()))
    )


def _has(values: Iterable[str] | None, wanted: str) -> bool:
    found = set(values or ())
    return wanted in found or "*" in found


def _namespace(obj: Mapping[str, Any]) -> str | None:
    return str((obj.get("metadata") or {}).get("namespace") or "") or None
