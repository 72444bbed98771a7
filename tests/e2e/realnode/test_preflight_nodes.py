"""Preflight on real nodes: a worker whose link is slowed is named, its node is marked, and
the gang trains on the other nodes (runPolicy.preflight, issue 26).

The chart is installed on the three real nodes of `three_nodes` (`three_node_release`). A gang of 2 workers x 2
processes (DDP over gloo, the job of test_training.py) asks 5 GPUs per worker: a real node
has 6 whole GPUs (2 are kept for sharing), so each worker takes a node and one node stays
free. As soon as the operator has placed the gang, the link into worker 1's node is slowed
to 200 Mbit/s with a token bucket on the bridge port that leads to it (tc tbf on the
host's end of the node's veth; this kernel has no netem). That is before the workers'
containers start: the launchers' bandwidth test then runs over the slow link. The verdict
must name worker 1 and that node, mark the node, and recreate the gang on the two other
nodes, where the test passes and the job trains to the end.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cluster.controlplane import Cluster
from cluster.realnode_net import NodeNetwork
from e2e.conftest import Release
from e2e.test_training import training_job
from integration.conftest import namespace_name
from integration.trainwave_fixtures import apply, wait_for_phase, wait_until, worker_pods
from trainwave import contract

pytestmark = pytest.mark.timeout(900)

RATE = "200mbit"  # into the slowed node; the bridge carries several Gbit/s between nodes
GPUS_PER_WORKER = 5  # of a real node's 6 whole GPUs: one worker per node


@pytest.fixture
def slowed() -> Iterator[list[str]]:
    """Devices this test shaped; the shaping is removed afterwards."""
    devices: list[str] = []
    yield devices
    for device in devices:
        subprocess.run(["tc", "qdisc", "del", "dev", device, "root"], check=False)


def slow_link_into(node: str, devices: list[str]) -> None:
    """Shape what the bridge sends to `node` (tw-real-N): the host's end of its veth."""
    device = NodeNetwork(int(node.rsplit("-", 1)[1])).host_veth
    subprocess.run(
        ["tc", "qdisc", "replace", "dev", device, "root", "tbf",
         "rate", RATE, "burst", "32kbit", "latency", "400ms"],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    devices.append(device)


def placed(cluster: Cluster, namespace: str, name: str, attempt: int) -> dict[int, str]:
    """Worker index -> node of the attempt's pods, once every worker has one."""
    nodes = {
        int(pod["metadata"]["labels"][contract.LABEL_RANK]): pod["spec"].get("nodeName", "")
        for pod in worker_pods(cluster, namespace, name)
        if pod["metadata"]["labels"][contract.LABEL_ATTEMPT] == str(attempt)
    }
    return nodes if len(nodes) == 2 and all(nodes.values()) else {}


def test_a_slowed_link_is_named_and_the_gang_trains_on_other_nodes(
    three_node_release: Release, tmp_path: Path, slowed: list[str]
) -> None:
    cluster, name = three_node_release.cluster, "preflight"
    namespace = namespace_name("preflight-nodes")
    cluster.kubectl("create", "namespace", namespace)
    cluster.kubectl(
        "wait", "--for=create", "serviceaccount/default", "-n", namespace, "--timeout=30s"
    )
    # 30 s of training: the verdict on attempt 1's test comes within a status poll (15 s).
    manifest: dict[str, Any] = training_job(name, tmp_path, steps=60, every=20, step_seconds=0.5)
    manifest["spec"]["gpusPerWorker"] = GPUS_PER_WORKER
    manifest["spec"]["runPolicy"]["preflight"] = {
        "enabled": True,
        "minFractionOfMedian": 0.5,
        "sizeMiB": 16,
        "timeoutSeconds": 120,
    }
    apply(cluster, namespace, manifest)
    first = wait_until(lambda: placed(cluster, namespace, name, 0), 60, "attempt 0 placed")
    assert first[0] != first[1], first
    slow_node = first[1]
    slow_link_into(slow_node, slowed)

    done = wait_for_phase(cluster, namespace, name, ("Succeeded", "Failed"), timeout=600)
    status = done["status"]
    summary = json.dumps(status, indent=1)
    assert status["phase"] == "Succeeded", summary
    assert status["attempt"] == 1, summary  # recreated once, for the failed test
    assert status["disruptions"] == 1, summary
    assert status["preflight"]["passed"] is True, summary
    assert status["preflight"]["attempt"] == 1, summary

    # The verdict on attempt 0 named worker 1 and its node (an Event, and the node's mark).
    events = json.loads(
        cluster.kubectl("get", "events", "-n", namespace, "-o", "json",
                        "--field-selector", f"involvedObject.name={name}").stdout
    )["items"]  # fmt: skip
    failed = [e["message"] for e in events if e.get("reason") == "PreflightFailed"]
    assert failed, [(e.get("reason"), e.get("message")) for e in events]
    assert "worker 1" in failed[0], failed
    assert slow_node in failed[0], failed
    node = json.loads(cluster.kubectl("get", "node", slow_node, "-o", "json").stdout)
    assert contract.ANNOTATION_STRAGGLER_UNTIL in node["metadata"].get("annotations", {})

    # Attempt 1 ran on the two other nodes.
    second = placed(cluster, namespace, name, 1)
    assert slow_node not in second.values(), (slow_node, second)
    assert len(set(second.values())) == 2, second
    print(f"preflight named {slow_node}: {failed[0]}; attempt 1 on {sorted(second.values())}")

    cluster.kubectl("annotate", "node", slow_node, f"{contract.ANNOTATION_STRAGGLER_UNTIL}-")
    cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
