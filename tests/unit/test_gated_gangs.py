"""Which gated gangs a round may place: only those the cache sees whole."""

from trainwave.controller.clusterview import ClusterView
from trainwave.controller.placement_inputs import Ticket, gated_gangs
from trainwave.placement.gang_types import GangRequest
from trainwave.placement.records import PodRecord, WorkerIdentity
from trainwave.placement.requirements import PodNeeds

KEY = ("ns", "job")


def worker(rank: int, *, gated: bool) -> PodRecord:
    return PodRecord(
        namespace="ns", name=f"job-a0-worker-{rank}", uid=f"u{rank}",
        node="" if gated else "n0", holds=not gated, bound=not gated, deleting=False,
        worker=WorkerIdentity("job", 0, rank), gated=gated,
        needs=PodNeeds() if gated else None,
    )  # fmt: skip


def view(gated: tuple[PodRecord, ...], running: tuple[PodRecord, ...] = ()) -> ClusterView:
    return ClusterView(
        nodes=(), usage={}, gated={KEY: gated}, workers={KEY: running} if running else {},
        labels_version=0, shared_shapes=(),
    )  # fmt: skip


def ticket(finished: int = 0) -> Ticket:
    return Ticket(attempt=0, request=GangRequest("job", 2, 1), finished=finished)


def test_a_gang_the_cache_does_not_see_whole_waits() -> None:
    assert gated_gangs(view((worker(1, gated=True),)), {KEY: ticket()}) == {}


def test_a_partly_released_gang_gets_the_rest_placed() -> None:
    gang = gated_gangs(view((worker(1, gated=True),), (worker(0, gated=False),)), {KEY: ticket()})
    assert [p.name for p in gang[KEY]] == ["job-a0-worker-1"]


def test_a_worker_that_already_finished_counts_toward_the_gang() -> None:
    """The operator died between two creates of a gang created placed and came back after
    the first worker had ended: the cache's active pods no longer show it, the ticket
    does, and the missing worker is placed instead of waiting forever."""
    gang = gated_gangs(view((worker(1, gated=True),)), {KEY: ticket(finished=1)})
    assert [p.name for p in gang[KEY]] == ["job-a0-worker-1"]
    # The cache still shows the finished worker holding: counted twice, it waits a round.
    behind = view((worker(1, gated=True),), (worker(0, gated=False),))
    assert gated_gangs(behind, {KEY: ticket(finished=1)}) == {}
