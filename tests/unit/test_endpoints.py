"""Which workers the job's EndpointSlice names, and when it is written (lifecycle/endpoints.py)."""

from dataclasses import replace

from factories import make_pod

from trainwave.lifecycle.endpoints import (
    FOREIGN,
    addresses,
    foreign,
    host_unpublished,
    nameable,
    published,
    service_state,
)


def test_only_the_attempt_s_live_workers_with_an_address_are_named_by_rank() -> None:
    pods = [
        make_pod(1, attempt=2, pod_ip="10.0.0.2", ready=False),
        make_pod(0, attempt=2, pod_ip="10.0.0.1"),
        make_pod(2, attempt=2),  # no address yet
        make_pod(3, attempt=2, pod_ip="10.0.0.4", deleting=True),  # terminating
        make_pod(4, attempt=2, phase="Failed", pod_ip="10.0.0.5"),  # ended
        make_pod(5, attempt=2, phase="Succeeded", pod_ip="10.0.0.6"),
        replace(make_pod(6, attempt=2, pod_ip="10.0.0.7"), departed=True),  # gone
        make_pod(0, attempt=1, pod_ip="10.0.0.9"),  # the gang before
    ]
    named = published(pods, 2)
    assert [(e.rank, e.address, e.ready) for e in named] == [
        (0, "10.0.0.1", True),
        (1, "10.0.0.2", False),
    ]
    assert named[0].pod == pods[1].name
    assert named[0].uid == pods[1].uid
    assert addresses(named) == {(pods[1].name, "10.0.0.1"), (pods[0].name, "10.0.0.2")}


LIVE = frozenset({("w0", "10.0.0.1"), ("w1", "10.0.0.2")})


def test_a_slice_naming_exactly_the_live_workers_is_current() -> None:
    assert service_state([(3, LIVE)], 3, LIVE, applied=False) == (True, False)
    assert service_state([], 3, LIVE, applied=True) == (True, False), "applied moments ago"


def test_no_slice_yet_is_neither_current_nor_stale_it_waits_for_every_address() -> None:
    assert service_state([], 3, LIVE, applied=False) == (False, False)
    # Named so far: a subset of the live workers (a replacement still getting its address).
    partial = frozenset({("w0", "10.0.0.1")})
    assert service_state([(3, partial)], 3, LIVE, applied=False) == (False, False)


def test_a_slice_naming_a_gone_worker_or_another_attempt_is_stale() -> None:
    gone = frozenset({("w0", "10.0.0.1"), ("w1-old", "10.0.0.8")})
    assert service_state([(3, gone)], 3, LIVE, applied=False) == (False, True)
    assert service_state([(2, frozenset())], 3, LIVE, applied=False) == (False, True)
    # Withdrawn to nothing while the new gang has no address: current, nothing to write.
    assert service_state([(3, frozenset())], 3, frozenset(), applied=False) == (True, False)


def test_another_controller_s_slice_is_stale_even_beside_a_current_one() -> None:
    """kube-controller-manager's slices, left from a Service that had a selector, name the
    same hostnames: written again (and deleted) until the watch shows them gone."""
    states = [(3, LIVE), (FOREIGN, frozenset())]
    assert foreign(states)
    assert service_state(states, 3, LIVE, applied=True) == (False, True)
    assert not foreign([(3, LIVE)])


def test_addresses_an_endpoint_slice_may_not_hold_are_not_named() -> None:
    """The API server refuses them (ValidateEndpointIP): a host-network worker of the test
    kubelet has 127.0.0.1, and a refused slice must not stop the job."""
    for refused in ("127.0.0.1", "::1", "0.0.0.0", "169.254.1.2", "fe80::1", "224.0.0.5", "x"):
        assert not nameable(refused), refused
    for fine in ("10.244.0.7", "192.168.5.1", "fd00::5"):
        assert nameable(fine), fine
    assert (
        published([make_pod(0, pod_ip="127.0.0.1"), make_pod(1, pod_ip="10.0.0.2")], 0)[0].rank == 1
    )


def test_of_two_live_pods_of_a_rank_the_newest_replacement_is_named() -> None:
    # The old pod's delete not seen yet, its replacement up: DNS must name the new one.
    old = replace(make_pod(1, pod_ip="10.0.0.1"), uid="old")
    new = replace(make_pod(1, pod_ip="10.0.0.2"), name="demo-a0-worker-1-r1", uid="new", serial=1)
    for pods in ([old, new], [new, old]):
        (chosen,) = published(pods, 0)
        assert (chosen.pod, chosen.address) == ("demo-a0-worker-1-r1", "10.0.0.2")


def test_worker_0_is_unpublished_until_a_slice_of_its_attempt_names_its_address() -> None:
    host, other = make_pod(0, attempt=3, pod_ip="10.0.0.1"), make_pod(1, attempt=3)
    workers = published([host, other], 3)
    mine = frozenset({(host.name, "10.0.0.1")})
    assert host_unpublished([], 3, workers)
    assert host_unpublished([(2, mine)], 3, workers), "named by the old attempt's slice only"
    assert not host_unpublished([(3, mine)], 3, workers)
    assert not host_unpublished([], 3, workers, in_flight=(3, mine)), "applied moments ago"
    assert host_unpublished([], 3, workers, in_flight=(2, mine))
    moved = frozenset({(host.name, "10.0.0.9")})  # an address it no longer has
    assert host_unpublished([(3, moved)], 3, workers)


def test_nothing_is_due_early_while_worker_0_has_no_nameable_address() -> None:
    no_address = published([make_pod(0, attempt=1), make_pod(1, attempt=1, pod_ip="10.0.0.2")], 1)
    assert not host_unpublished([], 1, no_address)
    loopback = published([make_pod(0, attempt=1, pod_ip="127.0.0.1")], 1)
    assert not host_unpublished([], 1, loopback)
