"""The worker template's own topologySpreadConstraints, kept by gang placement (issue 9).

A private pool of one rack, two nodes per zone. Without a spread constraint the topology
objective packs a gang onto one node; with `DoNotSchedule` on the zone the workers are
split across the zones, and kube-scheduler binds them at the first try. A constraint
the pool can never meet waits with the reason in kube-scheduler's terms.
"""

from __future__ import annotations

from collections import Counter

import pytest

from integration.node_pools import node_pool
from integration.test_placement_constraints import pool_job, runs_first_try, waits_with
from integration.trainwave_fixtures import apply, get_json

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

ZONE = "topology.kubernetes.io/zone"
JOB_LABEL = "trainwave.io/job-name"


def zone_spread(job: str, **more: object) -> dict[str, object]:
    return {
        "topologySpreadConstraints": [
            {
                "maxSkew": 1,
                "topologyKey": ZONE,
                "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": {"matchLabels": {JOB_LABEL: job}},
                **more,
            }
        ]
    }


def test_a_zone_spread_is_kept_and_bound_at_the_first_try(cluster, namespace, running_operator):
    with node_pool(cluster, rack_sizes=(4,)) as pool:
        zone_of = {node: "a" if i < 2 else "b" for i, node in enumerate(pool.nodes)}
        for zone in ("a", "b"):
            nodes = [n for n, z in zone_of.items() if z == zone]
            cluster.kubectl("label", "nodes", *nodes, f"{ZONE}={zone}")

        apply(cluster, namespace, pool_job("packed", pool, workers=4, gpus=1))
        packed = runs_first_try(cluster, namespace, "packed")
        assert len(set(packed)) == 1, f"the control packs onto one node: {packed}"

        spread = pool_job("spread", pool, workers=4, gpus=1, template=zone_spread("spread"))
        apply(cluster, namespace, spread)
        nodes = runs_first_try(cluster, namespace, "spread")
        assert Counter(zone_of[n] for n in nodes) == {"a": 2, "b": 2}, nodes
        assert len(set(nodes)) == 2, f"inside each zone the workers share a node: {nodes}"
        events = get_json(cluster, namespace, "events.events.k8s.io")["items"]
        refused = [e for e in events if e.get("reason") == "FailedScheduling"]
        assert not refused, [e.get("note") for e in refused]


def test_a_spread_the_pool_cannot_meet_waits_saying_why(cluster, namespace, running_operator):
    with node_pool(cluster, rack_sizes=(2,)) as pool:
        cluster.kubectl("label", "nodes", pool.nodes[0], f"{ZONE}=a")
        cluster.kubectl("label", "nodes", pool.nodes[1], f"{ZONE}=b")
        # Three zones wanted, two exist: each zone may take maxSkew (1) worker, 3 asked.
        template = zone_spread("short", minDomains=3)
        apply(cluster, namespace, pool_job("short", pool, workers=3, gpus=1, template=template))
        why = waits_with(
            cluster,
            namespace,
            "short",
            f"would break topology spread on {ZONE} (maxSkew 1)",
            reasons={"TopologySpreadNotMet", "NeverFits"},
        )
        assert "2 workers placed within the topology spread" in why["message"], why
