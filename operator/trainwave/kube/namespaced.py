"""One informer per watched namespace, over one store: watching the namespaces the
operator was given (`--namespace`) through their namespaced LIST/WATCH endpoints,
instead of watching the whole cluster and dropping other namespaces' objects.

This is controller-runtime's multiNamespaceCache (sigs.k8s.io/controller-runtime
pkg/cache/multi_namespace_cache.go):
a namespaced resource gets an informer in each namespace, a cluster-scoped one
(Nodes) keeps its one cluster-wide informer. So the operator needs list/watch of
TrainingJobs and Services only in those namespaces (the chart's Role in each),
and the API server sends it nothing of the others.

Each namespace's informer relists on its own (its own resourceVersion, its own
410), so the shared store must not be replaced whole by one namespace's LIST:
each writes through a `_Slice` that replaces only its namespace's records and
hands the store the union, under one lock so two namespaces' writes keep order.

Names only: a shell pattern (`team-*`) names no endpoint, so with a pattern the
resource is watched cluster-wide and the caller's converter filters (this needs
cluster-wide list/watch, which the chart, whose watchNamespaces takes names,
never grants).
"""

from __future__ import annotations

import fnmatch
import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Generic, TypeVar

from trainwave.kube.informer import (
    Converter,
    EventHandlers,
    Informer,
    InformerGroup,
    Lister,
    Store,
)

logger = logging.getLogger(__name__)

R = TypeVar("R")

_PATTERN_CHARACTERS = frozenset("*?[")


def is_pattern(namespace: str) -> bool:
    return bool(_PATTERN_CHARACTERS & set(namespace))


def watched(namespace: str, namespaces: Sequence[str]) -> bool:
    """Whether `namespace` is one of `namespaces` (names or shell patterns, as
    --namespace takes them); an empty list watches every namespace."""
    return not namespaces or any(fnmatch.fnmatchcase(namespace, p) for p in namespaces)


class NamespacedInformers(InformerGroup, Generic[R]):
    """An informer per namespace, with the Informer's surface callers use (start, stop,
    wait_synced, force_relist: InformerGroup's, over every namespace's)."""

    def __init__(
        self,
        kind: str,
        namespaces: Iterable[str],
        lister_in: Callable[[str], Lister],
        convert: Converter[R],
        store: Store[R],
        *,
        handlers: EventHandlers[R] | None = None,
        on_change: Callable[[], None] = lambda: None,
        **options: Any,
    ):
        self.kind = kind
        self._store = store
        self._lock = threading.Lock()
        self._slices: dict[str, dict[str, R]] = {}
        self.by_namespace: dict[str, Informer[R]] = {
            namespace: Informer(
                f"{kind}@{namespace}",
                lister_in(namespace),
                convert,
                _Slice(self, namespace),
                handlers=handlers,
                on_change=on_change,
                **options,
            )
            for namespace in dict.fromkeys(namespaces)
        }
        self._slices = {namespace: {} for namespace in self.by_namespace}

    @property
    def informers(self) -> list[Informer[R]]:
        return list(self.by_namespace.values())

    @property
    def synced(self) -> bool:
        return all(informer.synced for informer in self.informers)

    @property
    def lists(self) -> int:
        return sum(informer.lists for informer in self.informers)

    @property
    def relists(self) -> int:
        return sum(informer.relists for informer in self.informers)

    @property
    def events(self) -> int:
        return sum(informer.events for informer in self.informers)

    @property
    def errors(self) -> int:
        return sum(informer.errors for informer in self.informers)

    def apply(self, event: Mapping[str, Any]) -> bool:
        """Apply one watch event through its namespace's informer (as its watch would)."""
        meta = (event.get("object") or {}).get("metadata") or {}
        informer = self.by_namespace.get(str(meta.get("namespace") or ""))
        return informer.apply(event) if informer is not None else False

    def _replace(self, namespace: str, records: Mapping[str, R]) -> None:
        with self._lock:
            self._slices[namespace] = dict(records)
            union: dict[str, R] = {}
            for kept in self._slices.values():
                union.update(kept)
            self._store.replace(union)

    def _put(self, namespace: str, key: str, record: R | None) -> None:
        with self._lock:
            kept = self._slices[namespace]
            if record is None:
                kept.pop(key, None)
            else:
                kept[key] = record
            self._store.put(key, record)


class _Slice(Generic[R]):
    """One namespace's informer's view of the shared store."""

    def __init__(self, owner: NamespacedInformers[R], namespace: str):
        self._owner, self._namespace = owner, namespace

    def replace(self, records: Mapping[str, R]) -> None:
        self._owner._replace(self._namespace, records)

    def put(self, key: str, record: R | None) -> None:
        self._owner._put(self._namespace, key, record)


AnyInformer = Informer[R] | NamespacedInformers[R]


def informer_in(
    kind: str,
    namespaces: Iterable[str],
    *,
    everywhere: Lister,
    lister_in: Callable[[str], Lister],
    convert: Converter[R],
    store: Store[R],
    **options: Any,
) -> Informer[R] | NamespacedInformers[R]:
    """`kind` watched in `namespaces` (names), or cluster-wide when they are empty or
    one is a pattern (the caller's converter must then drop what it does not watch)."""
    wanted = tuple(namespaces)
    if not wanted or any(is_pattern(namespace) for namespace in wanted):
        if wanted:
            logger.info(
                "%s: namespace patterns %s name no endpoint; watching cluster-wide and "
                "keeping matches only (needs cluster-wide list/watch)",
                kind,
                ", ".join(wanted),
            )
        return Informer(kind, everywhere, convert, store, **options)
    return NamespacedInformers(kind, wanted, lister_in, convert, store, **options)
