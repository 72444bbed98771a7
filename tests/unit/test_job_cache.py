"""The reconcilers' job cache without a cluster: what wakes a job, and that a relist
after a watch gap drops a worker deleted meanwhile (kopf's indexes kept it)."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace
from typing import Any

import pytest

from trainwave import contract
from trainwave.api.trainingjob import JobKey
from trainwave.builders.names import service_name
from trainwave.builders.service import MANAGED_BY, MANAGED_BY_LABEL, SERVICE_NAME_LABEL
from trainwave.controller.job_cache import JobCache
from trainwave.lifecycle.endpoints import FOREIGN
from unit.test_cluster_cache import FakeApi, raw_pod, until

pytestmark = pytest.mark.timeout(20)


def raw_job(name: str, namespace: str = "ns", version: str = "1") -> dict[str, Any]:
    return {
        "apiVersion": contract.API_VERSION,
        "kind": "TrainingJob",
        "metadata": {"name": name, "namespace": namespace, "resourceVersion": version},
        "spec": {"workers": 2},
        "status": {"phase": "Running"},
    }


def raw_slice(
    job: str, namespace: str = "ns", attempt: int | None = None, named: dict[str, str] | None = None
) -> dict[str, Any]:
    """An EndpointSlice as the operator writes it: `named` maps pod names to addresses."""
    service = service_name(job, attempt or 0)
    labels = {contract.LABEL_JOB_NAME: job, MANAGED_BY_LABEL: MANAGED_BY,
              SERVICE_NAME_LABEL: service}  # fmt: skip
    if attempt is not None:
        labels[contract.LABEL_ATTEMPT] = str(attempt)
    endpoints = [
        {"addresses": [address], "targetRef": {"kind": "Pod", "name": pod}}
        for pod, address in (named or {}).items()
    ]
    return {"metadata": {"name": service, "namespace": namespace, "labels": labels},
            "endpoints": endpoints}  # fmt: skip


class Cluster:
    """Three fake listers behind a JobCache; `woken` counts wakes per job."""

    def __init__(self, jobs: list[Any], pods: list[Any], slices: list[Any], **options: Any):
        self.jobs, self.pods, self.slices = FakeApi(jobs), FakeApi(pods), FakeApi(slices)
        kube = SimpleNamespace(
            custom=SimpleNamespace(list_cluster_custom_object=lambda *_, **kw: self.jobs(**kw)),
            core=SimpleNamespace(
                list_pod_for_all_namespaces=self.pods,
            ),
            discovery=SimpleNamespace(list_endpoint_slice_for_all_namespaces=self.slices),
        )
        self.woken: Counter[JobKey] = Counter()
        self.cache = JobCache(kube, lambda key: self.woken.update([key]), page_size=2, **options)  # type: ignore[arg-type]

    def __enter__(self) -> JobCache:
        self.cache.start()
        assert self.cache.wait_synced(5)
        return self.cache

    def __exit__(self, *_: object) -> None:
        self.cache.stop()


def test_first_list_fills_every_store_and_wakes_every_job() -> None:
    fake = Cluster(
        [raw_job("a"), raw_job("b"), raw_job("c", namespace="other")],
        [raw_pod("a-0", job="a"), raw_pod("a-1", job="a"), raw_pod("stray")],
        [raw_slice("a")],
    )
    with fake as cache:
        assert sorted(cache.job_keys()) == [("ns", "a"), ("ns", "b"), ("other", "c")]
        assert sorted(p.name for p in cache.worker_pods(("ns", "a"))) == ["a-0", "a-1"]
        assert cache.worker_pods(("ns", "b")) == []
        assert cache.service_states(("ns", "a")) == {(-1, frozenset())}, "no attempt label"
        assert cache.service_states(("ns", "b")) == frozenset()
        assert set(fake.woken) == {("ns", "a"), ("ns", "b"), ("other", "c")}
        assert cache.phase_counts() == Counter({"Running": 3})
        assert cache.stats()["worker-pods"] == (2, 0), "the unlabelled pod is not kept"


def test_relist_after_a_gap_drops_a_deleted_worker_and_wakes_only_its_job() -> None:
    fake = Cluster(
        [raw_job("a"), raw_job("b")],
        [raw_pod("a-0", job="a"), raw_pod("b-0", job="b")],
        [],
    )
    woken = fake.woken
    with fake as cache:
        cache.stop()  # the watch is down: nothing reports the deletion below
        fake.pods.objects = [raw_pod("b-0", job="b")]
        woken.clear()
        cache.start()  # lists again and replaces, as after a 410
        until(lambda: cache.worker_pods(("ns", "a")) == [])
        assert cache.pods.relists == 1
        assert woken == Counter({("ns", "a"): 1}), "b's view did not change"


def test_a_pod_update_that_changes_nothing_decisions_read_wakes_nobody() -> None:
    pod = raw_pod("a-0", job="a", node="n0")
    fake = Cluster([raw_job("a")], [pod], [])
    woken = fake.woken
    with fake as cache:
        woken.clear()
        touched = {**pod, "metadata": {**pod["metadata"], "resourceVersion": "12"}}
        cache.pods.apply({"type": "MODIFIED", "object": touched})
        assert woken == Counter()
        failed = {**touched, "status": {"phase": "Failed"}}
        cache.pods.apply({"type": "MODIFIED", "object": failed})
        assert woken == Counter({("ns", "a"): 1})
        cache.pods.apply({"type": "DELETED", "object": failed})
        assert cache.worker_pods(("ns", "a")) == []
        assert woken == Counter({("ns", "a"): 2})


def test_a_worker_s_change_wakes_through_wake_pod_and_a_job_s_change_directly() -> None:
    pod = raw_pod("a-0", job="a", node="n0")
    batched: Counter[JobKey] = Counter()
    fake = Cluster([raw_job("a")], [pod], [], wake_pod=lambda key: batched.update([key]))
    with fake as cache:
        fake.woken.clear()
        batched.clear()
        failed = {**pod, "status": {"phase": "Failed"}}
        cache.pods.apply({"type": "MODIFIED", "object": failed})
        assert batched == Counter({("ns", "a"): 1})
        assert fake.woken == Counter(), "a pod's change goes to the batched wake only"
        cache.jobs.apply({"type": "MODIFIED", "object": raw_job("a", version="7")})
        assert fake.woken == Counter({("ns", "a"): 1})
        assert batched == Counter({("ns", "a"): 1})


def test_slice_states_follow_adds_changes_and_deletes() -> None:
    fake = Cluster([raw_job("a")], [], [])
    with fake as cache:
        cache.slices.apply({"type": "ADDED", "object": raw_slice("a", attempt=2)})
        assert cache.service_states(("ns", "a")) == {(2, frozenset())}
        fake.woken.clear()
        named = raw_slice("a", attempt=2, named={"a-a2-worker-0": "10.0.0.1"})
        cache.slices.apply({"type": "MODIFIED", "object": named})
        assert cache.service_states(("ns", "a")) == {
            (2, frozenset({("a-a2-worker-0", "10.0.0.1")}))
        }
        assert fake.woken == Counter({("ns", "a"): 1}), "what it names changed"
        cache.slices.apply({"type": "MODIFIED", "object": named})
        assert fake.woken == Counter({("ns", "a"): 1}), "the same names wake nobody"
        cache.slices.apply({"type": "DELETED", "object": named})
        assert cache.service_states(("ns", "a")) == frozenset()
        # kube-controller-manager's, with the labels it copies from a Service that had a
        # selector: whatever it names, it is foreign.
        theirs = raw_slice("a", attempt=2, named={"a-a2-worker-0": "10.0.0.1"})
        theirs["metadata"]["name"] = "a-x7k2p"
        theirs["metadata"]["labels"][MANAGED_BY_LABEL] = "endpointslice-controller.k8s.io"
        cache.slices.apply({"type": "ADDED", "object": theirs})
        assert cache.service_states(("ns", "a")) == {(FOREIGN, frozenset())}


def test_a_job_s_slices_are_one_state_per_attempt_they_name() -> None:
    """A job of over 1,000 workers has a slice per 1,000 ranks, and each attempt a Service
    of its own (builders/service.py)."""
    fake = Cluster([raw_job("a")], [], [])
    first = raw_slice("a", attempt=3, named={"a-a3-worker-0": "10.0.0.1"})
    second = raw_slice("a", attempt=3, named={"a-a3-worker-1000": "10.0.0.2"})
    second["metadata"]["name"] = "a-a3.1"
    with fake as cache:
        cache.slices.apply({"type": "ADDED", "object": first})
        cache.slices.apply({"type": "ADDED", "object": second})
        both = frozenset({("a-a3-worker-0", "10.0.0.1"), ("a-a3-worker-1000", "10.0.0.2")})
        assert cache.service_states(("ns", "a")) == {(3, both)}
        # The next attempt's Service, while the last one's has not gone yet.
        after = raw_slice("a", attempt=4, named={"a-a4-worker-0": "10.0.0.3"})
        cache.slices.apply({"type": "ADDED", "object": after})
        assert cache.service_states(("ns", "a")) == {
            (4, frozenset({("a-a4-worker-0", "10.0.0.3")})),
            (3, both),
        }


def test_a_slice_an_earlier_operator_wrote_for_a_later_attempt_is_not_read() -> None:
    """It named every attempt under the job's own Service; the names of that attempt's pods
    still lead there, and the operator leaves it as it was (builders/service.py)."""
    fake = Cluster([raw_job("a")], [], [])
    theirs = raw_slice("a", attempt=2, named={"a-a2-worker-1": "10.0.0.1"})
    theirs["metadata"]["name"] = "a"
    theirs["metadata"]["labels"][SERVICE_NAME_LABEL] = "a"
    with fake as cache:
        cache.slices.apply({"type": "ADDED", "object": theirs})
        assert cache.service_states(("ns", "a")) == frozenset()
        cache.slices.apply({"type": "ADDED", "object": raw_slice("a", attempt=2)})
        assert cache.service_states(("ns", "a")) == {(2, frozenset())}


def test_namespaces_filter_keeps_only_matching_jobs_and_children() -> None:
    fake = Cluster(
        [raw_job("a", "team-x"), raw_job("b", "team-y"), raw_job("c", "default")],
        [raw_pod("a-0", job="a", namespace="team-x"), raw_pod("c-0", job="c", namespace="default")],
        [raw_slice("c", "default")],
        namespaces=("team-*",),
    )
    with fake as cache:
        assert sorted(cache.job_keys()) == [("team-x", "a"), ("team-y", "b")]
        assert cache.worker_pods(("default", "c")) == []
        assert [p.name for p in cache.worker_pods(("team-x", "a"))] == ["a-0"]
        assert cache.service_states(("default", "c")) == frozenset()


def test_deleted_job_leaves_the_store_and_wakes_its_key() -> None:
    fake = Cluster([raw_job("a")], [], [])
    woken = fake.woken
    with fake as cache:
        woken.clear()
        cache.jobs.apply({"type": "DELETED", "object": raw_job("a", version="5")})
        assert cache.body(("ns", "a")) is None
        assert woken == Counter({("ns", "a"): 1})


def test_a_deleted_worker_s_last_state_is_handed_over_before_it_is_forgotten() -> None:
    left: list[tuple[JobKey, str, str]] = []
    fake = Cluster(
        [raw_job("a")],
        [raw_pod("a-0", job="a", node="n0")],
        [],
        on_departure=lambda key, pod: left.append((key, pod.name, pod.reason)),
    )
    with fake as cache:
        assert cache.jobs_on({"n0"}) == {("ns", "a")}
        assert cache.jobs_on({"n1"}) == set()
        gone = raw_pod("a-0", job="a", node="n0", phase="Failed")
        gone["status"]["reason"] = "Evicted"
        cache.pods.apply({"type": "DELETED", "object": gone})
        assert left == [(("ns", "a"), "a-0", "Evicted")], "its final state, not the stored one"
        assert cache.worker_pods(("ns", "a")) == []


def test_a_worker_deleted_in_a_gap_is_handed_over_with_its_last_state() -> None:
    left: list[tuple[JobKey, str, str]] = []
    fake = Cluster(
        [raw_job("a")],
        [raw_pod("a-0", job="a", node="n0"), raw_pod("a-1", job="a", node="n0")],
        [],
        on_departure=lambda key, pod: left.append((key, pod.name, pod.phase.value)),
    )
    with fake as cache:
        cache.stop()  # the watch is down: no DELETED event for a-1
        fake.pods.objects = [raw_pod("a-0", job="a", node="n0")]
        cache.start()
        until(lambda: len(cache.worker_pods(("ns", "a"))) == 1)
        assert left == [(("ns", "a"), "a-1", "Running")], "the relist's tombstone, unwrapped"


class NamespacedCluster(Cluster):
    """The same objects behind namespaced listers only: a cluster-wide call fails, as
    the chart's RBAC refuses it with watchNamespaces."""

    def __init__(self, jobs: list[Any], pods: list[Any], slices: list[Any], **options: Any):
        def in_namespace(objects: list[Any], namespace: str) -> FakeApi:
            return FakeApi([o for o in objects if o["metadata"]["namespace"] == namespace])

        def refused(*_: Any, **__: Any) -> None:
            raise AssertionError("a cluster-wide LIST or WATCH")

        self.apis: dict[tuple[str, str], FakeApi] = {}
        for kind, objects in (("jobs", jobs), ("pods", pods), ("slices", slices)):
            for namespace in {o["metadata"]["namespace"] for o in objects}:
                self.apis[kind, namespace] = in_namespace(objects, namespace)

        def lister(kind: str) -> Any:
            def listing(namespace: str, *_: Any, **kwargs: Any) -> Any:
                api = self.apis.setdefault((kind, namespace), FakeApi([]))
                return api(**kwargs)

            return listing

        kube = SimpleNamespace(
            custom=SimpleNamespace(
                list_cluster_custom_object=refused,
                list_namespaced_custom_object=lambda _g, _v, ns, _p, **kw: lister("jobs")(ns, **kw),
            ),
            core=SimpleNamespace(
                list_pod_for_all_namespaces=refused,
                list_namespaced_pod=lister("pods"),
            ),
            discovery=SimpleNamespace(
                list_endpoint_slice_for_all_namespaces=refused,
                list_namespaced_endpoint_slice=lister("slices"),
            ),
        )
        self.woken: Counter[JobKey] = Counter()
        self.cache = JobCache(kube, lambda key: self.woken.update([key]), page_size=2, **options)  # type: ignore[arg-type]


def test_named_namespaces_are_each_watched_through_their_own_endpoints() -> None:
    fake = NamespacedCluster(
        [raw_job("a", "team-x"), raw_job("b", "team-y"), raw_job("c", "default")],
        [raw_pod("a-0", job="a", namespace="team-x"), raw_pod("b-0", job="b", namespace="team-y")],
        [raw_slice("c", "default")],
        namespaces=("team-x", "team-y"),
    )
    with fake as cache:
        assert sorted(cache.job_keys()) == [("team-x", "a"), ("team-y", "b")]
        assert not fake.apis["jobs", "default"].calls, "an unwatched namespace is never listed"
        assert {kind for kind, ns in fake.apis if fake.apis[kind, ns].calls} == {
            "jobs", "pods", "slices",
        }  # fmt: skip
        # One namespace relists (its own 410) and a-0 went meanwhile: team-y's worker stays.
        fake.apis["pods", "team-x"].objects = []
        fake.woken.clear()
        cache.pods.by_namespace["team-x"].force_relist()  # type: ignore[union-attr]
        until(lambda: cache.worker_pods(("team-x", "a")) == [])
        assert [p.name for p in cache.worker_pods(("team-y", "b"))] == ["b-0"]
        assert fake.woken == Counter({("team-x", "a"): 1})
        assert cache.stats()["worker-pods"] == (1, 1)
        # A watch event arrives through its namespace's informer.
        cache.pods.apply({"type": "ADDED", "object": raw_pod("a-1", job="a", namespace="team-x")})
        assert [p.name for p in cache.worker_pods(("team-x", "a"))] == ["a-1"]
