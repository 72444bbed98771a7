"""What an informer's handlers hear: every watch event, and on a relist the deletions
the watch missed, as client-go's DeltaFIFO.Replace reports them (tombstones)."""

from __future__ import annotations

from typing import Any

import pytest

from trainwave.contract import GPU_RESOURCE
from trainwave.kube.informer import (
    Deleted,
    DeletedFinalStateUnknown,
    EventHandlers,
    Informer,
)
from trainwave.placement.records import PodRecord, pod_record
from unit.test_cluster_cache import DictStore, FakeApi, event, raw_pod, until

pytestmark = pytest.mark.timeout(20)


class Heard:
    """The handler calls in order, and what the store held at each delete."""

    def __init__(self, store: DictStore):
        self.calls: list[tuple[str, str, Any]] = []
        self.stored_at_delete: list[bool] = []
        self._store = store

    def handlers(self) -> EventHandlers[PodRecord]:
        return EventHandlers(
            on_add=lambda key, record: self.calls.append(("add", key, record)),
            on_update=lambda key, old, new: self.calls.append(("update", key, (old, new))),
            on_delete=self._deleted,
        )

    def _deleted(self, key: str, deleted: Deleted[PodRecord]) -> None:
        self.stored_at_delete.append(key in self._store.records)
        self.calls.append(("delete", key, deleted))

    def of(self, kind: str) -> dict[str, Any]:
        return {key: what for k, key, what in self.calls if k == kind}


def started(api: FakeApi) -> tuple[Informer[PodRecord], DictStore, Heard]:
    store = DictStore()
    heard = Heard(store)
    informer = Informer("pods", api, pod_record, store, handlers=heard.handlers(), page_size=2)
    informer.start()
    assert informer.wait_synced(5)
    return informer, store, heard


def test_a_relist_reports_what_vanished_as_a_tombstone_with_its_last_state() -> None:
    a_running = raw_pod("a", node="n0", gpus=1)
    api = FakeApi([raw_pod("a", node="n0"), raw_pod("b", node="n0")])
    informer, store, heard = started(api)
    try:
        assert sorted(heard.of("add")) == ["ns/a", "ns/b"], "the first LIST adds everything"
        informer.apply(event("MODIFIED", a_running))  # the last state the operator sees of a
        heard.calls.clear()
        api.objects = [raw_pod("b", node="n1"), raw_pod("c", node="n0")]  # a went in a gap
        informer.force_relist()
        until(lambda: informer.relists == 1 and sorted(store.records) == ["ns/b", "ns/c"])

        deletes = heard.of("delete")
        assert deletes == {"ns/a": DeletedFinalStateUnknown("ns/a", pod_record(a_running))}
        assert dict(deletes["ns/a"].obj.requests) == {GPU_RESOURCE: 1}, "the last state seen"
        assert heard.stored_at_delete == [True], "told before the store forgets it"
        assert heard.of("add") == {"ns/c": pod_record(raw_pod("c", node="n0"))}
        old, new = heard.of("update")["ns/b"]
        assert (old.node, new.node) == ("n0", "n1")
        # Deletions first (while the store holds them), then the list in its order.
        assert [kind for kind, _, _ in heard.calls] == ["delete", "update", "add"]
    finally:
        informer.stop()


def test_a_relist_after_stop_and_start_reports_deletions_too() -> None:
    api = FakeApi([raw_pod("a", node="n0")])
    informer, _, heard = started(api)
    informer.stop()
    api.objects = []
    heard.calls.clear()
    informer.start()  # lists again, as after an operator's lost watch
    try:
        until(lambda: bool(heard.of("delete")))
        (tombstone,) = heard.of("delete").values()
        assert isinstance(tombstone, DeletedFinalStateUnknown)
        assert tombstone.key == "ns/a"
    finally:
        informer.stop()


def test_watch_events_report_final_states_and_a_record_no_longer_kept_as_deleted() -> None:
    api = FakeApi([raw_pod("a", node="n0", job="j"), raw_pod("b", node="n0")])
    informer, store, heard = started(api)
    try:
        heard.calls.clear()
        failed = raw_pod("a", node="n0", job="j", phase="Failed")  # a worker's is kept
        informer.apply(event("DELETED", failed))
        assert heard.of("delete") == {"ns/a": pod_record(failed)}, "the event's final state"
        # pod_record keeps nothing of a pod on no node that is not pending: b leaves our
        # set on a MODIFIED event, and is reported deleted with the last state kept.
        informer.apply(event("MODIFIED", raw_pod("b", phase="Succeeded")))
        assert heard.of("delete")["ns/b"] == pod_record(raw_pod("b", node="n0"))
        assert heard.stored_at_delete == [True, True]
        assert store.records == {}
        informer.apply(event("ADDED", raw_pod("c", node="n0")))
        informer.apply(event("MODIFIED", raw_pod("c", node="n1")))
        assert [k for k, key, _ in heard.calls if key == "ns/c"] == ["add", "update"]
    finally:
        informer.stop()
