"""`make demo`: the main job, end to end on this machine, as a user runs trainwave.

Starts the local control plane with simulated GPU nodes (kwok) and one real node (a real
kubelet and containerd, tests/cluster) whose private registry holds the `make images`
images. Installs the chart with `helm install` from that registry (a pull secret, as on any
cluster with a private registry), so the operator runs as two pods on the real node, one
elected leader. Applies every example and prints `kubectl get tj` until each reaches its
outcome (the suspended one is resumed once the others are done). The real node is tainted
as a system node pool that only the operator's pods tolerate, so the examples' workers go
to the simulated GPU nodes. The cluster stays up afterwards; `make cluster-down` stops it.
"""

import json
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from cluster import deploy  # noqa: E402
from cluster.controlplane import ensure_cluster  # noqa: E402
from cluster.realnode_config import REAL_NODE_TYPE  # noqa: E402
from cluster.topology import KWOK_NODE_TYPE_LABEL  # noqa: E402

NAMESPACE = "trainwave-demo"
TOPOLOGY = REPO / "tests" / "cluster" / "topologies" / "small.yaml"
FINAL = {"Succeeded", "Failed"}
TIMEOUT = 240
OPERATOR = "deployment/trainwave"


def main() -> int:
    started = time.monotonic()
    print("==> starting the local control plane: kube-apiserver, scheduler, controller-manager,")
    print("    kwok's simulated GPU nodes, one real node (kubelet, containerd) and its registry")
    cluster = ensure_cluster(TOPOLOGY, real_nodes=1, timeout=300)
    print(f"    KUBECONFIG={cluster.kubeconfig}")
    (node,) = cluster.real_nodes
    deploy.taint_system_node(cluster, node)  # trainwave's own pods there, no job's workers
    workdir = cluster.state_dir / "demo"
    workdir.mkdir(exist_ok=True)
    values = deploy.registry_values() | {
        "nodeSelector": {KWOK_NODE_TYPE_LABEL: REAL_NODE_TYPE},
        "tolerations": [{**deploy.SYSTEM_TAINT, "operator": "Equal"}],
    }
    values_file = workdir / "values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    print("==> helm upgrade --install trainwave from the cluster's registry")
    deploy.apply_pull_secret(cluster)
    chart, pull = deploy.publish_chart(cluster)
    print(f"    the chart: helm package, helm push to {chart}")
    deploy.install_chart(cluster, "-f", str(values_file), *pull, chart=chart)
    print(f"    values {values_file}: images from the registry, the operator's pods on {node}")
    deploy.restart_stale_pods(cluster)
    deploy.wait_rolled_out(cluster)
    print(cluster.kubectl("get", "pods", "-n", deploy.NAMESPACE, "-o", "wide").stdout)
    cluster.kubectl(
        "delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=true", timeout=120
    )
    cluster.kubectl("create", "namespace", NAMESPACE)
    print(f"==> kubectl apply -n {NAMESPACE} -f examples/")
    print(cluster.kubectl("apply", "-n", NAMESPACE, "-f", str(REPO / "examples")).stdout)
    resumed = watch(cluster)
    print(cluster.kubectl("get", "tj", "-n", NAMESPACE, "-o", "wide").stdout)
    print(f"==> done in {time.monotonic() - started:.0f}s; the cluster keeps running:")
    print(f"    export KUBECONFIG={cluster.kubeconfig}; kubectl get tj -A")
    print(f"    kubectl logs -n {deploy.NAMESPACE} {OPERATOR}   # the operator; make cluster-down")
    return 0 if resumed else 1


def operator_available(cluster) -> bool:
    """At least one operator pod is Ready (the Deployment's availableReplicas)."""
    found = cluster.kubectl("get", OPERATOR, "-n", deploy.NAMESPACE, "-o", "json", check=False)
    if found.returncode != 0:
        return False
    return int(json.loads(found.stdout).get("status", {}).get("availableReplicas") or 0) > 0


def watch(cluster) -> bool:
    """Print the table on every change; resume the suspended job once the rest are done."""
    deadline = time.monotonic() + TIMEOUT
    last, resumed = "", False
    while time.monotonic() < deadline:
        table = cluster.kubectl("get", "tj", "-n", NAMESPACE).stdout
        if table != last:
            print(time.strftime("%H:%M:%S"), "kubectl get tj", "\n" + table)
            last = table
        phases = cluster.kubectl(
            "get", "tj", "-n", NAMESPACE, "-o", "jsonpath={.items[*].status.phase}"
        ).stdout.split()
        unfinished = [p for p in phases if p not in FINAL]
        if not unfinished and resumed:
            return True
        if unfinished == ["Suspended"] and not resumed:
            print("==> resuming the suspended example")
            cluster.kubectl("patch", "tj", "suspended", "-n", NAMESPACE, "--type=merge",
                            "-p", '{"spec":{"runPolicy":{"suspend":false}}}')  # fmt: skip
            resumed = True
        if not operator_available(cluster):
            logs = cluster.kubectl("logs", "-n", deploy.NAMESPACE, OPERATOR, "--tail=40",
                                   check=False)  # fmt: skip
            print(f"no operator pod is Ready:\n{logs.stdout}{logs.stderr}")
            return False
        time.sleep(1)
    print(f"timed out after {TIMEOUT}s")
    return False


if __name__ == "__main__":
    sys.exit(main())
