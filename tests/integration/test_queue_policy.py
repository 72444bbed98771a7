"""The queue's bounded backfill end to end: at the default bound a small gang starts on room
a blocked, larger gang could use; with the operator's `--queue-max-skips 0` (the chart's
`queue.maxSkips`) the larger gang is protected at once and the small one is held for it
(placement/queueing.py rule 3), and a gang whose runPolicy.maxRunSeconds ends before the
held gang could start takes the held room anyway (rule 9).

Each test gets a private pool of two simulated 8-GPU nodes; a plain pod fills one of them,
so a 2-node gang is blocked and a 1-node gang arriving after it finds room only on the other.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from cluster.deploy import OperatorProcess
from integration.node_pools import Pool, blocker_pod, node_pool
from integration.trainwave_fixtures import (
    apply,
    condition,
    job,
    job_manifest,
    operator_restarted_with,
    wait_for_phase,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


@pytest.fixture
def strict_fifo_operator(running_operator: OperatorProcess) -> Iterator[OperatorProcess]:
    """The session operator restarted with --queue-max-skips 0, and started again after."""
    with operator_restarted_with(running_operator, "--queue-max-skips", "0") as strict:
        yield strict


def pool_job(name: str, pool: Pool, workers: int) -> dict:
    return job_manifest(name, workers=workers, gpus=8, run_for="120s",
                        template_spec={"nodeSelector": pool.selector})  # fmt: skip


def scheduled(cluster, namespace: str, name: str) -> dict:
    return condition(job(cluster, namespace, name), "Scheduled") or {}


def held_for_earlier(cluster, namespace: str, name: str) -> dict:
    """The job's Scheduled condition once the queue holds it for an earlier gang."""
    return wait_until(
        lambda: (
            (found := scheduled(cluster, namespace, name)).get("reason") == "HeldForEarlierJob"
            and found
        ),
        60,
        f"{name} held for an earlier gang",
    )


def block_a_large_gang(cluster, namespace: str, pool: Pool) -> None:
    """One node full, a 2-node gang waiting for it with the placer's answer given."""
    apply(cluster, namespace, blocker_pod("hold", pool.nodes[0], 8))
    apply(cluster, namespace, pool_job("large", pool, workers=2))
    wait_until(
        lambda: (
            (found := scheduled(cluster, namespace, "large")).get("status") == "False"
            and found.get("reason") != "Placing"
        ),
        60,
        "the large gang blocked",
    )


def test_a_small_gang_backfills_behind_a_blocked_one(cluster, namespace, running_operator):
    with node_pool(cluster, rack_sizes=(2,)) as pool:
        block_a_large_gang(cluster, namespace, pool)
        apply(cluster, namespace, pool_job("small", pool, workers=1))
        wait_for_phase(cluster, namespace, "small", "Running", timeout=60)
        assert scheduled(cluster, namespace, "large").get("status") == "False"


def test_max_skips_0_holds_the_small_gang_for_the_earlier_one(
    cluster, namespace, strict_fifo_operator
):
    with node_pool(cluster, rack_sizes=(2,)) as pool:
        block_a_large_gang(cluster, namespace, pool)
        apply(cluster, namespace, pool_job("small", pool, workers=1))
        held = held_for_earlier(cluster, namespace, "small")
        assert held["status"] == "False"
        assert f"waiting for {namespace}/large" in held["message"]
        assert job(cluster, namespace, "small")["status"]["phase"] != "Running"
        # The room kept for it is the large gang's once the node frees up.
        cluster.kubectl("delete", "pod", "-n", namespace, "hold", "--grace-period=0", "--force")
        wait_for_phase(cluster, namespace, "large", "Running", timeout=60)
        assert scheduled(cluster, namespace, "small").get("status") == "False"


def bounded_job(name: str, pool: Pool, workers: int, max_run: int) -> dict:
    return job_manifest(name, workers=workers, gpus=8, run_for="300s",
                        run_policy={"maxRunSeconds": max_run},
                        template_spec={"nodeSelector": pool.selector})  # fmt: skip


def test_a_gang_that_ends_in_time_starts_on_the_held_room(cluster, namespace, strict_fifo_operator):
    """Rule 9 end to end: a gang bounded to 300 s fills one node; the 2-node gang waiting
    for it is protected at once (--queue-max-skips 0), so its shadow time is that bound.
    A 1-node gang bounded to 20 s is gone by then and starts on the held node; one bounded
    to 600 s is held, and its reason says why."""
    with node_pool(cluster, rack_sizes=(2,)) as pool:
        apply(cluster, namespace, bounded_job("busy", pool, workers=1, max_run=300))
        wait_for_phase(cluster, namespace, "busy", "Running", timeout=60)
        apply(cluster, namespace, pool_job("large", pool, workers=2))
        wait_until(
            lambda: scheduled(cluster, namespace, "large").get("reason") == "NotEnoughGPUs",
            60,
            "the large gang blocked",
        )
        apply(cluster, namespace, bounded_job("long", pool, workers=1, max_run=600))
        held = held_for_earlier(cluster, namespace, "long")
        assert "runPolicy.maxRunSeconds (600s) would not end before" in held["message"]
        apply(cluster, namespace, bounded_job("short", pool, workers=1, max_run=20))
        wait_for_phase(cluster, namespace, "short", "Running", timeout=60)
        assert scheduled(cluster, namespace, "large").get("status") == "False"
        assert job(cluster, namespace, "long")["status"]["phase"] != "Running"
