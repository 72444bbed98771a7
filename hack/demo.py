"""`make demo`: the main job, end to end on this machine.

Starts the local control plane with simulated GPU nodes, installs the chart,
runs the operator as the chart's ServiceAccount, applies every example and
prints `kubectl get tj` until each reaches its outcome (the suspended one is
resumed once the others are done). The cluster stays up afterwards for
poking around; `make cluster-down` stops it.
"""

import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from cluster.controlplane import ensure_cluster  # noqa: E402
from cluster.deploy import OperatorProcess, install_chart, service_account_kubeconfig  # noqa: E402

NAMESPACE = "trainwave-demo"
TOPOLOGY = REPO / "tests" / "cluster" / "topologies" / "small.yaml"
FINAL = {"Succeeded", "Failed"}
TIMEOUT = 240


def main() -> int:
    started = time.monotonic()
    print(
        "==> starting the local control plane (kube-apiserver, scheduler, controller-manager, kwok)"
    )
    cluster = ensure_cluster(TOPOLOGY)
    print(f"    KUBECONFIG={cluster.kubeconfig}")
    print("==> helm upgrade --install trainwave charts/trainwave")
    install_chart(cluster)
    workdir = cluster.state_dir / "demo"
    workdir.mkdir(exist_ok=True)
    operator = OperatorProcess(
        kubeconfig=service_account_kubeconfig(cluster, workdir / "operator.kubeconfig"),
        log_path=workdir / "operator.log",
    )
    print(f"==> running the operator as the chart's ServiceAccount (log: {operator.log_path})")
    operator.start()
    try:
        cluster.kubectl(
            "delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=true", timeout=120
        )
        cluster.kubectl("create", "namespace", NAMESPACE)
        print(f"==> kubectl apply -n {NAMESPACE} -f examples/")
        print(cluster.kubectl("apply", "-n", NAMESPACE, "-f", str(REPO / "examples")).stdout)
        resumed = watch(cluster, operator)
    finally:
        operator.stop()
    print(cluster.kubectl("get", "tj", "-n", NAMESPACE, "-o", "wide").stdout)
    print(f"==> done in {time.monotonic() - started:.0f}s; the cluster keeps running:")
    print(f"    export KUBECONFIG={cluster.kubeconfig}; kubectl get tj -A; make cluster-down")
    return 0 if resumed else 1


def watch(cluster, operator) -> bool:
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
        if not operator.alive():
            print("operator died:\n" + operator.tail())
            return False
        time.sleep(1)
    print(f"timed out after {TIMEOUT}s")
    return False


if __name__ == "__main__":
    sys.exit(main())
