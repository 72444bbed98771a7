"""The placer's own releases count until its watch cache shows them (controller/inflight.py)."""

from __future__ import annotations

from typing import Any

import pytest

from trainwave.controller.clusterview import ClusterIndex
from trainwave.controller.inflight import Inflight
from trainwave.placement.records import node_record, pod_record

pytestmark = pytest.mark.timeout(10)

NODE = {
    "metadata": {"name": "n0", "labels": {"kubernetes.io/hostname": "n0"}},
    "status": {"allocatable": {"nvidia.com/gpu": "8", "cpu": "64", "pods": "110"}},
}


def worker(released_to: str | None) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": "job-a0-worker-0",
        "namespace": "ns",
        "labels": {"trainwave.io/job-name": "job", "trainwave.io/role": "worker",
                   "trainwave.io/rank": "0", "trainwave.io/attempt": "0"},
        "annotations": {},
    }  # fmt: skip
    spec: dict[str, Any] = {
        "containers": [{"name": "worker", "resources": {"limits": {"nvidia.com/gpu": 8}}}]
    }
    if released_to is None:
        spec["schedulingGates"] = [{"name": "trainwave.io/placement"}]
    else:
        meta["annotations"]["trainwave.io/node"] = released_to
    return {"metadata": meta, "spec": spec, "status": {"phase": "Pending"}}


def view_with(pod: dict[str, Any]):  # type: ignore[no-untyped-def]
    index = ClusterIndex()
    index.put_node("n0", node_record(NODE))
    index.put_pod("ns/job-a0-worker-0", pod_record(pod))
    return index.view()


def test_a_release_counts_until_the_cache_shows_it_and_no_longer() -> None:
    inflight = Inflight()
    stale = view_with(worker(None))  # the cache has not seen the release yet
    [gated] = stale.gated[("ns", "job")]
    inflight.add(gated, "n0")

    inflight.settle(stale)
    assert inflight.covers([gated]), "the gang is not offered for placement twice"
    assert inflight.apply(stale.snapshot()).node("n0").free == 0, "its 8 GPUs are taken"

    caught_up = view_with(worker("n0"))
    inflight.settle(caught_up)
    assert len(inflight) == 0
    assert caught_up.snapshot().node("n0").free == 0, "the cache counts it now, once"


def test_a_refused_release_gives_its_room_back() -> None:
    """Reserved before the patch is sent; a patch the API server refuses frees the room."""
    inflight = Inflight()
    stale = view_with(worker(None))
    [gated] = stale.gated[("ns", "job")]
    inflight.add(gated, "n0")
    assert inflight.apply(stale.snapshot()).node("n0").free == 0

    inflight.forget(gated)
    assert not inflight.covers([gated]), "the gang is offered for placement again"
    assert inflight.apply(stale.snapshot()).node("n0").free == 8
