"""Diagnostic: how long a worker's name stays unresolvable after the operator publishes it,
when a worker asked for it before (CoreDNS's negative cache), on the real node.

A job's headless Service and its EndpointSlice appear only once every worker has an address
(concepts/trainingjob.md), so a worker that starts first may look a peer's name up before it
exists. CoreDNS, configured as kubeadm deploys it (`kubernetes ... { ttl 30 }`, `cache 30`:
tests/cluster/realnode_dns.py), answers NXDOMAIN and may keep that answer. Measured here:

- `asked-early`: a pod on the real node resolves `<job>-worker-0.<service>` (as MASTER_ADDR
  names it; the pod's DNS search path completes it) every 0.2 s from before the Service exists; the Service and its slice (hostname
  `<job>-worker-0`, the address of a pod that exists) are written as the operator writes them,
  and the time from the slice's creation to the first answer is recorded;
- `asked-late`: the same, with the first lookup only after the slice exists.

Run as root, with nothing else using the real node:
    flock /tmp/realnode.lock ~/.cache/trainwave/venv-py311/bin/python tests/benchmarks/dns_negative_cache.py
Env: BENCH_DNS_ROUNDS (default 2). Writes tests/benchmarks/results/dns-negative-cache.{json,md}.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "tests"), str(REPO / "operator")]

from benchmarks.operator_cluster import fresh_namespace, real_node_cluster  # noqa: E402
from benchmarks.provenance import git_commit, write_results  # noqa: E402
from cluster.controlplane import Cluster  # noqa: E402
from cluster.realnode_dns import COREFILE  # noqa: E402
from e2e.conftest import ON_REAL_NODE, WORKER_IMAGE, install_release  # noqa: E402
from integration.trainwave_fixtures import wait_until  # noqa: E402

RESULTS = REPO / "tests" / "benchmarks" / "results"
NAMESPACE = "bench-dns"
ROUNDS = int(os.environ.get("BENCH_DNS_ROUNDS", "2"))
EARLY_SECONDS = 3.0  # how long the early asker hears NXDOMAIN before the slice is written
WAIT_SECONDS = 60.0  # no answer this long after the slice: reported as such

# Prints "<epoch seconds> ok|fail" per lookup, through the C library as torch's store does.
RESOLVER = """
import socket, sys, time
name = sys.argv[1]
while True:
    try:
        socket.getaddrinfo(name, 29500, proto=socket.IPPROTO_TCP)
        print(f"{time.time():.3f} ok", flush=True)
        break
    except socket.gaierror:
        print(f"{time.time():.3f} fail", flush=True)
    time.sleep(0.2)
time.sleep(3600)
"""


def asker(name: str, fqdn: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "nodeSelector": ON_REAL_NODE,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "ask",
                    "image": WORKER_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["python3", "-c", RESOLVER, fqdn],
                }
            ],
        },
    }


def publish(cluster: Cluster, service: str, hostname: str, address: str) -> float:
    """The Service and slice as the operator writes them (builders/service.py); the time the
    slice's create returned."""
    manifests = [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": service, "namespace": NAMESPACE},
            "spec": {"clusterIP": "None", "ports": [{"name": "rdzv", "port": 29500}]},
        },
        {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": service,
                "namespace": NAMESPACE,
                "labels": {
                    "kubernetes.io/service-name": service,
                    "endpointslice.kubernetes.io/managed-by": "trainwave.io",
                },
            },
            "addressType": "IPv4",
            "ports": [{"name": "rdzv", "port": 29500, "protocol": "TCP"}],
            "endpoints": [
                {"addresses": [address], "hostname": hostname, "conditions": {"ready": True}}
            ],
        },
    ]
    cluster.kubectl("apply", "-f", "-", input=json.dumps(manifests[0]))
    cluster.kubectl("create", "-f", "-", input=json.dumps(manifests[1]))
    return time.time()


def lookups(cluster: Cluster, pod: str) -> list[tuple[float, bool]]:
    out = cluster.kubectl("logs", "-n", NAMESPACE, pod, check=False).stdout
    found = []
    for line in out.splitlines():
        stamp, _, verdict = line.partition(" ")
        try:
            found.append((float(stamp), verdict == "ok"))
        except ValueError:
            continue
    return found


def one_round(cluster: Cluster, index: int, early: bool) -> dict[str, Any]:
    service = f"r{index}-{'early' if early else 'late'}"
    hostname = f"j{index}-worker-0"
    fqdn = f"{hostname}.{service}"  # as MASTER_ADDR is written: the search path completes it
    pod = f"ask-{service}"
    if early:
        cluster.kubectl("apply", "-f", "-", input=json.dumps(asker(pod, fqdn)))
        wait_until(lambda: len(lookups(cluster, pod)) >= 2, 120, "the first lookups")
        time.sleep(EARLY_SECONDS)
    # Any address: a lookup answers whether or not it is reachable.
    published = publish(cluster, service, hostname, "10.244.0.250")
    if not early:
        cluster.kubectl("apply", "-f", "-", input=json.dumps(asker(pod, fqdn)))
    deadline = time.time() + WAIT_SECONDS + 120
    while time.time() < deadline and not any(ok for _, ok in lookups(cluster, pod)):
        time.sleep(0.5)
    seen = lookups(cluster, pod)
    first_ok = next((t for t, ok in seen if ok), None)
    counted_from = max(published, seen[0][0]) if seen else published
    return {
        "mode": "asked-early" if early else "asked-late",
        "round": index,
        "lookups_before_publish": sum(1 for t, ok in seen if not ok and t < published),
        "failed_lookups_after_publish": sum(1 for t, ok in seen if not ok and t >= published),
        "publish_to_first_answer_seconds": None
        if first_ok is None
        else round(first_ok - counted_from, 2),
    }


def render(result: dict[str, Any]) -> str:
    rows = "\n".join(
        f"| {r['round']} | {r['mode']} | {r['lookups_before_publish']} | "
        f"{r['failed_lookups_after_publish']} | {r['publish_to_first_answer_seconds']} |"
        for r in result["runs"]
    )
    c = result["conditions"]
    return f"""# A name asked before it exists: CoreDNS's negative cache (dns_negative_cache.py)

Commit {result["commit"]}, {c["date"]}. CoreDNS {c["coredns"]} on the real node, Corefile:

```
{c["corefile"].strip()}
```

| round | mode | NXDOMAIN answers before the slice | NXDOMAIN answers after it | slice created -> first answer (s) |
|---|---|---|---|---|
{rows}

`asked-early`: lookups every 0.2 s from {EARLY_SECONDS:.0f} s before the Service and slice were
written, counted from the slice's create; `asked-late`: the asker created after the slice,
counted from its first lookup. Lookups through the C library (`getaddrinfo`), as torch's
store does; the pod's resolv.conf as the kubelet writes it (search path, ndots 5).
Machine: {c["cpus"]} cores; 1-min load {c["load"]}.
"""


def main() -> int:
    if os.geteuid() != 0:
        print("dns_negative_cache needs root (the real node)", file=sys.stderr)
        return 2
    with real_node_cluster() as cluster:
        install_release(cluster)
        fresh_namespace(cluster, NAMESPACE)
        runs = []
        for index in range(ROUNDS):
            for early in (True, False):
                runs.append(one_round(cluster, index, early))
                print(json.dumps(runs[-1]), flush=True)
        cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false")
    result = {
        "benchmark": "dns-negative-cache",
        "commit": git_commit(),
        "conditions": {
            "date": time.strftime("%Y-%m-%d %H:%M %Z"),
            "coredns": "v1.15.0 (tests/cluster/install-tools.sh)",
            "corefile": COREFILE,
            "cpus": os.cpu_count(),
            "load": [round(x, 2) for x in os.getloadavg()],
        },
        "runs": runs,
    }
    write_results(RESULTS / "dns-negative-cache", result, render(result))
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    sys.exit(main())
