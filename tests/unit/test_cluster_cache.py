"""The watch cache without a cluster: the index's incremental sums, and the informer's
list / watch / relist loop against a fake API that serves pages and JSON-line streams."""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from cluster.inventory import inventory_annotation
from trainwave import contract
from trainwave.backoff import Backoff
from trainwave.controller.clusterview import ChangeLog, ClusterIndex
from trainwave.kube import informer as informer_module
from trainwave.kube.informer import Informer, object_key
from trainwave.placement.node_memo import NodeInfoMemo
from trainwave.placement.records import PodRecord, node_record, pod_record
from trainwave.placement.requirements import PodNeeds
from trainwave.placement.shared_tasks import SharedShape, pinned_shape
from trainwave.placement.snapshot import usage_of
from trainwave.placement.topology import Topology

pytestmark = pytest.mark.timeout(20)

NODES = ("n0", "n1", "n2")
SHAPES = (  # two worker shapes the slot checks ask about
    PodNeeds(requests=((contract.GPU_RESOURCE, 1),)),
    PodNeeds(requests=((contract.GPU_RESOURCE, 2),)),
)


def raw_node(name: str, rack: str = "r0", gpus: int = 8) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"rack": rack}},
        "status": {"allocatable": {contract.GPU_RESOURCE: str(gpus), "pods": "110"}},
    }


def raw_pod(
    name: str,
    *,
    node: str = "",
    gpus: int = 0,
    cpu: str = "",
    port: int = 0,
    job: str = "",
    gated: bool = False,
    phase: str = "Running",
    gpu_uuid: str = "",
    mib: int = 0,
    namespace: str = "ns",
) -> dict[str, Any]:
    """A pod as the API server sends it; `job` makes it a trainwave worker (rank = name)."""
    requests: dict[str, Any] = {}
    if gpus:
        requests[contract.GPU_RESOURCE] = str(gpus)
    if cpu:
        requests["cpu"] = cpu
    if gpu_uuid:
        requests[contract.SHARED_GPU_MEMORY_RESOURCE] = str(mib)
    container: dict[str, Any] = {"name": "c", "resources": {"requests": requests}}
    if port:
        container["ports"] = [{"containerPort": port, "hostPort": port}]
    labels = {}
    if job:
        labels = {
            contract.LABEL_JOB_NAME: job,
            contract.LABEL_ROLE: contract.ROLE_WORKER,
            contract.LABEL_ATTEMPT: "0",
            contract.LABEL_RANK: str(sum(map(ord, name)) % 100),
        }
    spec: dict[str, Any] = {"containers": [container]}
    if node:
        spec["nodeName"] = node
    if gated:
        spec["schedulingGates"] = [{"name": contract.SCHEDULING_GATE}]
    annotations = {contract.ANNOTATION_GPU_UUID: gpu_uuid} if gpu_uuid else {}
    meta = {"name": name, "namespace": namespace, "uid": f"uid-{name}", "labels": labels}
    return {
        "metadata": {**meta, "annotations": annotations},
        "spec": spec,
        "status": {"phase": phase},
    }


def put(index: ClusterIndex, pod: dict[str, Any]) -> None:
    index.put_pod(object_key(pod), pod_record(pod))


def index_of_nodes() -> ClusterIndex:
    """An index holding NODES, 8 GPUs each, and no pods."""
    index = ClusterIndex()
    for node in NODES:
        index.put_node(node, node_record(raw_node(node)))
    return index


# --- the index ----------------------------------------------------------------------------


def test_pod_added_modified_deleted_moves_usage() -> None:
    index = ClusterIndex()
    put(index, raw_pod("a", node="n0", gpus=2, cpu="500m", port=80))
    put(index, raw_pod("b", node="n0", gpus=3, port=80))
    usage = index.view().usage["n0"]
    assert (usage.requests[contract.GPU_RESOURCE], usage.pods, usage.requests["cpu"]) == (5, 2, 500)
    assert [p[2] for p in usage.host_ports] == [80]

    put(index, raw_pod("a", node="n1", gpus=1))  # modified: moved (a test can do that)
    view = index.view()
    assert view.usage["n0"].requests == {contract.GPU_RESOURCE: 3}
    assert [p[2] for p in view.usage["n0"].host_ports] == [80], "b still declares the port"
    assert view.usage["n1"].requests == {contract.GPU_RESOURCE: 1}

    index.put_pod("ns/b", None)
    index.put_pod("ns/a", None)
    assert dict(index.view().usage) == {}


def test_finished_or_foreign_pending_pod_holds_nothing_and_is_dropped() -> None:
    index = ClusterIndex()
    put(index, raw_pod("a", node="n0", gpus=2))
    put(index, raw_pod("a", node="n0", gpus=2, phase="Succeeded"))
    put(index, raw_pod("pending", gpus=8))  # not ours, not bound: no record
    assert dict(index.view().usage) == {}
    assert index.counts["pods"] == 0


def test_gated_and_running_workers_are_indexed_by_job() -> None:
    index = ClusterIndex()
    put(index, raw_pod("w0", job="train", gated=True, gpus=8))
    put(index, raw_pod("w1", job="train", gated=True, gpus=8))
    put(index, raw_pod("x0", job="other", node="n2", gpus=8))
    view = index.view()
    assert [p.name for p in view.gated[("ns", "train")]] == ["w0", "w1"]
    assert [p.name for p in view.workers[("ns", "other")]] == ["x0"]
    assert ("ns", "train") not in view.workers

    put(index, raw_pod("w0", job="train", node="n0", gpus=8))  # released and bound
    view = index.view()
    assert [p.name for p in view.gated[("ns", "train")]] == ["w1"]
    assert [p.name for p in view.workers[("ns", "train")]] == ["w0"]


def test_shared_shapes_follow_pinned_pods() -> None:
    index = ClusterIndex()
    put(index, raw_pod("s0", node="n0", gpu_uuid="GPU-1", mib=20000))
    put(index, raw_pod("s1", node="n0", gpu_uuid="GPU-1", mib=10000, cpu="1500m"))
    view = index.view()
    assert view.shared_shapes == (SharedShape(10000, 1500), SharedShape(20000, 0))
    assert view.usage["n0"].gpu_mib == {"GPU-1": 30000}
    index.put_pod("ns/s0", None)
    assert index.view().shared_shapes == (SharedShape(10000, 1500),)


def test_relist_replaces_the_store_and_phantoms_vanish() -> None:
    index = ClusterIndex()
    for name in ("a", "b", "c"):
        put(index, raw_pod(name, node="n0", gpus=1, job="j"))
    # b was deleted while the watch was down: the relist does not have it.
    listed = {
        object_key(p): pod_record(p) for p in (raw_pod(n, node="n0", gpus=1, job="j") for n in "ac")
    }
    index.replace_pods({k: r for k, r in listed.items() if r is not None})
    view = index.view()
    assert view.usage["n0"].pods == 2
    assert [p.name for p in view.workers[("ns", "j")]] == ["a", "c"]


def test_labels_version_moves_only_with_node_names_or_labels() -> None:
    index = ClusterIndex()
    index.replace_nodes({n: node_record(raw_node(n)) for n in NODES})
    first = index.view().labels_version
    index.put_node("n0", node_record(raw_node("n0", gpus=4)))  # capacity only
    assert index.view().labels_version == first
    index.put_node("n0", node_record(raw_node("n0", rack="r9")))
    second = index.view().labels_version
    assert second > first
    index.put_node("n1", None)
    assert index.view().labels_version > second
    assert [n.name for n in index.view().nodes] == ["n0", "n2"]
    same = index.view().labels_version
    index.replace_nodes({n.name: n for n in index.view().nodes})
    assert index.view().labels_version == same


def test_view_is_reused_until_something_changes() -> None:
    index = ClusterIndex()
    put(index, raw_pod("a", node="n0", gpus=1))
    view = index.view()
    assert index.view() is view
    put(index, raw_pod("b", node="n0", gpus=1))
    assert index.view() is not view


def random_pod(rng: random.Random, name: str) -> dict[str, Any]:
    gated = rng.random() < 0.2
    return raw_pod(
        name,
        node="" if gated else rng.choice(NODES),
        gpus=rng.choice((0, 1, 2, 8)),
        cpu=rng.choice(("", "250m", "2")),
        port=rng.choice((0, 0, 80, 443)),
        job=rng.choice(("", "j1", "j2")),
        gated=gated,
        phase=rng.choice(("Running",) * 5 + ("Succeeded", "Failed")),
        gpu_uuid=rng.choice(("", "", "GPU-a", "GPU-b")),
        mib=rng.choice((0, 10000, 40000)),
    )


@pytest.mark.parametrize("seed", range(8))
def test_incremental_usage_equals_usage_of_after_random_events(seed: int) -> None:
    rng = random.Random(seed)
    index = index_of_nodes()
    memo, placer_memo = NodeInfoMemo(), NodeInfoMemo()
    known_topology: tuple[int, Topology] | None = None
    live: dict[str, PodRecord] = {}
    for step in range(400):
        name = f"p{rng.randrange(40)}"
        key = f"ns/{name}"
        roll = rng.random()
        if roll < 0.02:  # a node changed (relabelled, resized), or only its heartbeat
            node = rng.choice(NODES)
            raw = raw_node(node, rack=rng.choice(("r0", "r1")), gpus=rng.choice((4, 8)))
            index.put_node(node, node_record(raw))
        elif roll < 0.03:  # a view nobody snapshots: the memos fall behind by a version
            index.view()
        elif roll < 0.05:  # a relist: some pods went while nobody watched
            listed = {k: r for k, r in live.items() if rng.random() < 0.7}
            index.replace_pods(listed)
            live = dict(listed)
        elif roll < 0.25:
            index.put_pod(key, None)
            live.pop(key, None)
        else:
            record = pod_record(random_pod(rng, name))
            index.put_pod(key, record)
            if record is None:
                live.pop(key, None)
            else:
                live[key] = record
        if step % 50 == 0 or step == 399:
            view = index.view()
            assert dict(view.usage) == usage_of(live.values()), f"step {step}"
            gated = {(r.namespace, r.worker.job) for r in live.values() if r.worker and r.gated}
            assert set(view.gated) == gated
            held = sorted(
                pinned_shape(r.gpu_mib, r.requests) for r in live.values() if r.holds and r.gpu_uuid
            )
            assert list(view.shared_shapes) == held
            workers: dict[tuple[str, str], list[str]] = {}
            for k in sorted(live):
                r = live[k]
                if r.worker and r.holds:
                    workers.setdefault((r.namespace, r.worker.job), []).append(r.name)
            assert {j: [p.name for p in pods] for j, pods in view.workers.items()} == workers
            # The memo's snapshot (only changed nodes rebuilt) equals one built from scratch,
            # and so do the slots it carries over from the snapshot before.
            remembered, fresh = view.snapshot(memo=memo), view.snapshot()
            assert remembered.nodes == fresh.nodes, f"step {step}"
            for needs in SHAPES:
                assert remembered.slots(needs) == fresh.slots(needs), f"step {step}"
            # As the placer asks: the topology kept while the labels are, and the nodes the
            # change log names patched into the memo's last snapshot.
            reuse = (
                known_topology[1]
                if known_topology and known_topology[0] == view.labels_version
                else None
            )
            patched = view.snapshot(topology=reuse, memo=placer_memo)
            known_topology = (view.labels_version, patched.topology)
            assert patched.nodes == fresh.nodes, f"step {step}"
            assert patched.free == fresh.free, f"step {step}"
            for needs in SHAPES:
                assert patched.slots(needs) == fresh.slots(needs), f"step {step}"


def test_slots_are_recomputed_only_for_the_nodes_that_changed() -> None:
    index = index_of_nodes()
    memo = NodeInfoMemo()
    [one_gpu, two_gpus] = SHAPES
    assert index.view().snapshot(memo=memo).slots(one_gpu) == (8, 8, 8)
    assert memo.slots.recomputed == len(NODES)
    put(index, raw_pod("a", node="n1", gpus=3))
    assert index.view().snapshot(memo=memo).slots(one_gpu) == (8, 5, 8)
    assert memo.slots.recomputed == 1, "only n1 changed"
    assert index.view().snapshot(memo=memo).slots(two_gpus) == (4, 2, 4)
    assert memo.slots.recomputed == len(NODES), "a shape not asked before"
    index.put_node("n0", None)
    assert index.view().snapshot(memo=memo).slots(one_gpu) == (5, 8)
    assert memo.slots.recomputed == 2, "a node went: every position moved"


def test_node_info_memo_rebuilds_only_the_nodes_that_changed() -> None:
    index = index_of_nodes()
    memo = NodeInfoMemo()
    first = index.view().snapshot(memo=memo)
    assert memo.rebuilt == len(NODES)
    put(index, raw_pod("a", node="n1", gpus=2))
    second = index.view().snapshot(memo=memo)
    assert memo.rebuilt == 1, "only n1's usage changed"
    assert second.node("n1").free == 6
    assert first.node("n1").free == 8
    assert second.node("n0") is first.node("n0")
    index.put_node("n2", node_record(raw_node("n2", gpus=4)))
    third = index.view().snapshot(memo=memo)
    assert memo.rebuilt == 1
    assert third.node("n2").gpus == 4
    index.put_node("n0", None)
    assert [n.name for n in index.view().snapshot(memo=memo).nodes] == ["n1", "n2"]


def test_a_snapshot_patches_only_the_nodes_the_change_log_names() -> None:
    index = index_of_nodes()
    memo = NodeInfoMemo()
    first = index.view().snapshot(memo=memo)
    assert memo.rebuilt == len(NODES)
    put(index, raw_pod("a", node="n1", gpus=2))
    index.view()  # a view the memo never sees: the log spans both versions
    put(index, raw_pod("b", node="n2", gpus=1))
    second = index.view().snapshot(topology=first.topology, memo=memo)
    assert memo.rebuilt == 2, "n1 and n2 changed over the two versions"
    assert [second.node(n).free for n in NODES] == [8, 6, 7]
    assert second.node("n0") is first.node("n0")
    third = index.view().snapshot(topology=first.topology, memo=memo)
    assert memo.rebuilt == 0, "the same view: nothing changed"
    assert third.nodes == second.nodes


def test_a_heartbeat_or_a_status_write_placement_does_not_read_keeps_the_view() -> None:
    index = ClusterIndex()
    index.put_node("n0", node_record(raw_node("n0")))
    put(index, raw_pod("a", node="n0", gpus=2))
    view = index.view()
    index.put_node("n0", node_record(raw_node("n0")))  # an equal record
    put(index, raw_pod("a", node="n0", gpus=2))
    assert index.view() is view
    index.put_node("n0", node_record(raw_node("n0", gpus=4)))
    assert index.view() is not view


def test_change_log_names_the_nodes_changed_between_two_versions() -> None:
    log = ChangeLog(size=3)
    log.add(1, frozenset({"a"}))
    log.add(2, frozenset({"b"}))
    assert log.since(0, 2) == {"a", "b"}
    assert log.since(1, 2) == {"b"}
    assert log.since(2, 2) == frozenset()
    assert log.since(-1, 2) is None, "a memo that never saw a view"
    assert log.since(2, 1) is None, "an older view than the memo's"
    log.add(3, None)
    assert log.since(1, 3) is None, "nodes came or went at 3"
    log.add(4, frozenset({"c"}))
    assert log.since(3, 4) == {"c"}
    assert log.since(0, 4) is None, "1 fell out of the log"


def test_view_inventories_reads_only_the_named_nodes_that_have_one() -> None:
    index = ClusterIndex()
    for node in NODES:
        raw = raw_node(node)
        if node != "n2":
            raw["metadata"]["annotations"] = inventory_annotation(
                node, gpus=8, product="H100", memory_mib=81920, nics=8,
                link_layer="IB", rate_gbps=400.0, gpu_direct=True,
            )  # fmt: skip
        index.put_node(node, node_record(raw))
    view = index.view()
    found = view.inventories(["n1", "n2", "missing", "n1"])
    assert list(found) == ["n1"]
    assert found["n1"] is index.node("n1").inventory  # type: ignore[union-attr]
    assert found["n1"] is not None
    assert view.inventories([]) == {}


# --- the informer against a fake API ------------------------------------------------------


class FakeResponse:
    def __init__(
        self, data: bytes = b"", lines: list[dict[str, Any]] | None = None, hold: bool = False
    ):
        self.data = data
        self._lines = lines or []
        self._hold = hold  # stream stays open until shutdown(), like an idle watch
        self._closed = threading.Event()

    def stream(self, amt: Any = None, decode_content: bool = False) -> Iterator[bytes]:
        text = b"".join(json.dumps(line).encode() + b"\n" for line in self._lines)
        yield text[: len(text) // 2]  # a chunk boundary inside a line
        yield text[len(text) // 2 :]
        if self._hold:
            self._closed.wait(10)

    def shutdown(self) -> None:
        self._closed.set()

    def release_conn(self) -> None:
        pass


class FakeApi:
    """Serves LISTs in pages of `limit` from `objects`, and queued watch streams."""

    def __init__(self, objects: list[dict[str, Any]], version: str = "10"):
        self.objects = objects
        self.version = version
        self.watches: list[FakeResponse] = []
        self.calls: list[dict[str, Any]] = []

    def __call__(self, **kwargs: Any) -> FakeResponse:
        self.calls.append(kwargs)
        if kwargs.get("watch"):
            return self.watches.pop(0) if self.watches else FakeResponse(hold=True)
        start = int(kwargs.get("_continue") or 0)
        end = start + kwargs["limit"]
        meta = {
            "resourceVersion": self.version,
            "continue": str(end) if end < len(self.objects) else "",
        }
        return FakeResponse(
            json.dumps({"items": self.objects[start:end], "metadata": meta}).encode()
        )


class DictStore:
    def __init__(self) -> None:
        self.records: dict[str, PodRecord] = {}

    def replace(self, records: Any) -> None:
        self.records = dict(records)

    def put(self, key: str, record: PodRecord | None) -> None:
        if record is None:
            self.records.pop(key, None)
        else:
            self.records[key] = record


def until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    done = threading.Event()
    for _ in range(int(timeout / 0.01)):
        if predicate():
            return
        done.wait(0.01)
    raise AssertionError("condition not met in time")


def event(kind: str, obj: dict[str, Any]) -> dict[str, Any]:
    return {"type": kind, "object": obj}


def test_informer_lists_in_pages_watches_and_relists_on_410() -> None:
    pods = [raw_pod(f"p{i}", node="n0", gpus=1) for i in range(5)]
    api = FakeApi(pods)
    gone, late = raw_pod("p1", node="n0", gpus=1), raw_pod("p9", node="n1", gpus=2)
    bookmark = {"metadata": {"resourceVersion": "15"}}
    api.watches.append(
        FakeResponse(
            lines=[
                event("ADDED", {**late, "metadata": {**late["metadata"], "resourceVersion": "11"}}),
                event("DELETED", gone),
                event("MODIFIED", raw_pod("p2", node="n0", gpus=1, phase="Failed")),
                event("BOOKMARK", bookmark),
                event("ERROR", {"kind": "Status", "code": 410, "message": "too old"}),
            ]
        )
    )
    store, changes = DictStore(), []
    informer = Informer(
        "pods", api, pod_record, store, on_change=lambda: changes.append(1), page_size=2
    )
    informer.start()
    try:
        assert informer.wait_synced(5)
        until(lambda: informer.relists == 1)
        # The relist (5 pods again) replaced what the watch had: p9 is not in the list.
        until(lambda: sorted(store.records) == [f"ns/p{i}" for i in range(5)])
        assert informer.events == 3
        list_calls = [c for c in api.calls if not c.get("watch")]
        assert [c.get("_continue") for c in list_calls[:3]] == [None, "2", "4"]
        first_watch = next(c for c in api.calls if c.get("watch"))
        assert first_watch["resource_version"] == "10"
        assert first_watch["allow_watch_bookmarks"] is True
        assert changes, "on_change was called"
    finally:
        informer.stop()
    assert not any(t.name == "informer-pods" for t in threading.enumerate())


@pytest.fixture
def tenth_relist_backoff(monkeypatch: pytest.MonkeyPatch) -> Backoff:
    """The informers' relist backoff with a tenth of its delays (0.1 s, then 0.2 s, ...):
    these tests check that the informer waits before it relists, not how long;
    test_backoff.py holds RELIST_BACKOFF's own delays."""
    real = informer_module.RELIST_BACKOFF
    tenth = Backoff(base=real.base / 10, cap=real.cap / 10, factor=real.factor, jitter=real.jitter)
    monkeypatch.setattr(informer_module, "RELIST_BACKOFF", tenth)
    return tenth


@pytest.mark.usefixtures("tenth_relist_backoff")
def test_informer_backs_off_and_recovers_after_errors() -> None:
    api = FakeApi([raw_pod("a", node="n0", gpus=1)])
    failures = iter([RuntimeError("connection refused")])

    def flaky(**kwargs: Any) -> FakeResponse:
        failure = next(failures, None)
        if failure is not None:
            raise failure
        return api(**kwargs)

    store = DictStore()
    informer = Informer("pods", flaky, pod_record, store)
    informer.start()
    try:
        assert informer.wait_synced(5), "listed after one backoff (0.1 s here)"
        assert informer.errors == 1
        assert list(store.records) == ["ns/a"]
        informer.force_relist()
        until(lambda: informer.relists == 1)
    finally:
        informer.stop()


def test_a_410_right_after_a_relist_backs_off_instead_of_spinning(
    tenth_relist_backoff: Backoff,
) -> None:
    api = FakeApi([raw_pod("a", node="n0", gpus=1)])
    expired = event("ERROR", {"kind": "Status", "code": 410, "message": "too old"})
    api.watches += [FakeResponse(lines=[expired]), FakeResponse(lines=[expired])]
    informer = Informer("pods", api, pod_record, DictStore())
    informer.start()
    try:
        until(lambda: informer.errors == 1)  # the first 410 relisted at once, the second waits
        assert informer.relists == 1
        second = tenth_relist_backoff.delay(2, rand=lambda: 0.0)  # the shortest it may be
        threading.Event().wait(second / 4)
        assert informer.relists == 1, f"no relist before the {second} s backoff"
        until(lambda: informer.relists == 2)
    finally:
        informer.stop()
