"""Watched objects filed by the job they belong to, for the caches reconciles read.

A store of `name -> (job key, record)` and the same records by job, kept in step
under the caller's lock. `replace` and `put` report which jobs' view changed, so
the caller can wake exactly those (job_cache.py for worker pods, workloads.py for
Kueue Workloads).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

# The owner's key (the controller's JobKey) stays a type parameter: filing by
# owner is machinery and knows nothing of what a job is.
K = TypeVar("K")
R = TypeVar("R")
Filed = tuple[K, R]


class ByJob(Generic[K, R]):
    def __init__(self) -> None:
        self._by_name: dict[str, Filed[K, R]] = {}
        self._by_job: dict[K, dict[str, R]] = {}

    def __len__(self) -> int:
        return len(self._by_name)

    def of(self, key: K) -> list[R]:
        return list(self._by_job.get(key, {}).values())

    def items(self) -> list[tuple[K, list[R]]]:
        return [(key, list(records.values())) for key, records in self._by_job.items()]

    def replace(self, records: Mapping[str, Filed[K, R]]) -> set[K]:
        """Everything anew (a relist); the jobs whose records were added, changed or lost."""
        old, self._by_name = self._by_name, dict(records)
        self._by_job = {}
        for name, (key, record) in self._by_name.items():
            self._by_job.setdefault(key, {})[name] = record
        changed = {old[n][0] for n in old.keys() - records.keys()}
        changed |= {records[n][0] for n in records if old.get(n) != records[n]}
        return changed

    def put(self, name: str, filed: Filed[K, R] | None) -> Filed[K, R] | None:
        """Add, update or (None) remove one object; returns what was filed before."""
        old = self._by_name.pop(name, None)
        if old is not None:
            siblings = self._by_job.get(old[0], {})
            siblings.pop(name, None)
            if not siblings:
                self._by_job.pop(old[0], None)
        if filed is not None:
            self._by_name[name] = filed
            self._by_job.setdefault(filed[0], {})[name] = filed[1]
        return old


class Store:
    """informer.py's Store protocol over two bound methods."""

    def __init__(self, replace: Callable[[Any], None], put: Callable[[str, Any], None]):
        self.replace, self.put = replace, put
