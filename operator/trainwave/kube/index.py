"""Watched objects filed by the owner they belong to, for the caches reconciles read.

An indexer of one index, the owner's key: client-go's Indexer
(k8s.io/client-go tools/cache/index.go, thread_safe_store.go) keeps objects by key
and, for each named index function, the keys under each index value. Here the one
index function is the converter's (it files each record with its owner), and
`replace` and `put` report which owners' view changed, so the caller can wake
exactly those (a jobs cache for worker pods, a Workloads cache). A store of
`name -> (owner key, record)` and the same records by owner, kept in step under
the caller's lock.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Generic, TypeVar

# The owner's key (a controller's JobKey) stays a type parameter: filing by
# owner is machinery and knows nothing of what a job is.
K = TypeVar("K")
R = TypeVar("R")
Filed = tuple[K, R]


class ByOwner(Generic[K, R]):
    def __init__(self) -> None:
        self._by_name: dict[str, Filed[K, R]] = {}
        self._by_owner: dict[K, dict[str, R]] = {}

    def __len__(self) -> int:
        return len(self._by_name)

    def of(self, key: K) -> list[R]:
        """The records filed under `key` (client-go's ByIndex)."""
        return list(self._by_owner.get(key, {}).values())

    def items(self) -> list[tuple[K, list[R]]]:
        return [(key, list(records.values())) for key, records in self._by_owner.items()]

    def replace(self, records: Mapping[str, Filed[K, R]]) -> set[K]:
        """Everything anew (a relist); the owners whose records were added, changed or lost."""
        old, self._by_name = self._by_name, dict(records)
        self._by_owner = {}
        for name, (key, record) in self._by_name.items():
            self._by_owner.setdefault(key, {})[name] = record
        changed = {old[n][0] for n in old.keys() - records.keys()}
        changed |= {records[n][0] for n in records if old.get(n) != records[n]}
        return changed

    def put(self, name: str, filed: Filed[K, R] | None) -> Filed[K, R] | None:
        """Add, update or (None) remove one object; returns what was filed before."""
        old = self._by_name.pop(name, None)
        if old is not None:
            siblings = self._by_owner.get(old[0], {})
            siblings.pop(name, None)
            if not siblings:
                self._by_owner.pop(old[0], None)
        if filed is not None:
            self._by_name[name] = filed
            self._by_owner.setdefault(filed[0], {})[name] = filed[1]
        return old
