"""What runs in the local control plane, and with which flags.

Pure: functions of a `Layout` (where files live) and `Ports`; nothing is started
here. controlplane.py starts the commands in the order of `COMPONENTS`.

Everything listens on 127.0.0.1 only, except the API server of a cluster with real
nodes (realnode.py), which listens on their bridge address instead
(`real_node_apiserver_flags`). The flags differ from a production
cluster in three deliberate ways, all for speed on a 2-core machine:
- etcd skips fsync (the data is thrown away with the cluster);
- API priority and fairness is off and the in-flight limits are high, so a
  burst of test traffic (1,000 node creates, a 100-job benchmark) is never
  throttled or queued by the server;
- node leases last NODE_LEASE_SECONDS (kwok renews each every quarter of it),
  longer for topologies beyond 1,024 nodes (`node_lease_seconds`), and the node
  controller's grace period is stretched to match.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cluster.pki import Pki
from cluster.topology import KWOK_NODE_ANNOTATION, KWOK_NODE_VALUE

COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")

SERVICE_CIDR = "10.96.0.0/16"
# Pod IPs handed out by kwok: 65k addresses, enough for thousands of pods, and
# disjoint from the service range (kwok's default 10.0.0.0/24 has 254).
POD_CIDR = "10.244.0.0/16"
NODE_IP = "127.0.0.1"

# 1,024 kwok nodes renewing a 40 s lease (the kubelet default) every 10 s are
# ~100 writes/s, most of the 2 cores at idle. 120 s means a renewal every
# ~30 s: ~34 writes/s for 1,024 nodes, negligible for the small topology.
NODE_LEASE_SECONDS = 120
# Nodes whose renewals NODE_LEASE_SECONDS keeps at ~34 writes/s; beyond it the lease grows
# with the node count, so 4,096 nodes (xlarge.yaml) renew as often in all as 1,024 do:
# at 120 s, 4,096 leases were ~136 renewals/s, most of a core before any job.
LEASE_NODES_PER_BASE = 1024
# The node controller marks a node NotReady when its lease has not moved for
# this long (1.5 leases: 180 s at 120 s); it must comfortably exceed the renew
# interval (a quarter lease) even when kwok lags under load, or pods get tainted
# and evicted mid-test.
NODE_MONITOR_GRACE_LEASES = 1.5


def node_lease_seconds(nodes: int) -> int:
    """The node lease kwok holds for a cluster of `nodes` simulated nodes: 120 s up to
    1,024 nodes, then 120 s more per further 1,024 (4,096 nodes: 480 s)."""
    return NODE_LEASE_SECONDS * max(1, -(-nodes // LEASE_NODES_PER_BASE))


def node_monitor_grace(lease_seconds: int) -> str:
    return f"{round(lease_seconds * NODE_MONITOR_GRACE_LEASES)}s"


KWOK_PARALLELISM = 16
CLIENT_QPS = 200
CLIENT_BURST = 400


@dataclass(frozen=True)
class Ports:
    etcd_client: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    scheduler: int
    kwok: int

    def to_json(self) -> dict[str, int]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Layout:
    """Where a cluster keeps its files; `root` is the state dir."""

    root: Path

    @property
    def pki(self) -> Pki:
        return Pki(self.root / "pki")

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    @property
    def state_file(self) -> Path:
        return self.root / "state.json"

    @property
    def marker(self) -> Path:
        # Proves a directory is ours before `down` deletes it.
        return self.root / ".trainwave-cluster"

    @property
    def etcd_data(self) -> Path:
        return self.root / "etcd"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def scheduler_config(self) -> Path:
        return self.root / "scheduler.yaml"

    @property
    def kwok_config(self) -> Path:
        return self.root / "kwok.yaml"

    @property
    def kwok_workdir(self) -> Path:
        return self.root / "kwok"

    @property
    def audit_policy(self) -> Path:
        return self.root / "audit-policy.yaml"

    @property
    def audit_log(self) -> Path:
        return self.logs / "audit.log"

    def log(self, component: str) -> Path:
        return self.logs / f"{component}.log"


def api_server_url(ports: Ports, host: str = "127.0.0.1") -> str:
    return f"https://{host}:{ports.apiserver}"


def real_node_apiserver_flags(pki: Pki, host: str) -> list[str]:
    """What changes when real nodes run (realnode.py): the API server listens on the
    nodes' bridge address, where the node namespaces and their pods can reach it."""
    return [
        f"--bind-address={host}",
        f"--advertise-address={host}",
        # Keeps the `kubernetes` Service's endpoint (the bridge address), so pods
        # reach the API server through https://kubernetes.default.svc.
        "--endpoint-reconciler-type=lease",
        "--enable-admission-plugins=NodeRestriction",
        # The API server's identity towards kubelets (logs, exec, port-forward);
        # the kubelet authorizes it by webhook like any other user.
        f"--kubelet-client-certificate={pki.apiserver_kubelet_client_cert}",
        f"--kubelet-client-key={pki.apiserver_kubelet_client_key}",
        # Node names are not resolvable here; the node's InternalIP is.
        "--kubelet-preferred-address-types=InternalIP",
    ]


def etcd_command(binary: Path, layout: Layout, ports: Ports) -> list[str]:
    client = f"http://127.0.0.1:{ports.etcd_client}"
    peer = f"http://127.0.0.1:{ports.etcd_peer}"
    return [
        str(binary),
        "--name=default",
        f"--data-dir={layout.etcd_data}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=default={peer}",
        "--unsafe-no-fsync=true",
        "--log-level=warn",
    ]


def audit_policy(users: Sequence[str]) -> dict[str, Any]:
    """An audit policy that records the requests of `users` only (`*`: everyone's), at level
    Metadata (verb, resource, user, timestamps; no bodies), once each when the response is
    complete."""
    everyone = "*" in users
    return {
        "apiVersion": "audit.k8s.io/v1",
        "kind": "Policy",
        "omitStages": ["RequestReceived", "ResponseStarted"],
        "rules": [
            {"level": "Metadata"} if everyone else {"level": "Metadata", "users": list(users)},
            {"level": "None"},
        ],
    }


def audit_flags(layout: Layout) -> list[str]:
    """kube-apiserver flags for the audit log; off unless a cluster asks for it (benchmarks
    count an operator's requests with it), since every audited request costs a write."""
    return [
        f"--audit-policy-file={layout.audit_policy}",
        f"--audit-log-path={layout.audit_log}",
        "--audit-log-format=json",
        "--audit-log-mode=batch",
        "--audit-log-maxsize=0",
    ]


# Shared GPUs as DRA devices with memory as consumable capacity (several claims on
# one GPU): alpha and off in 1.34. Without it on kube-apiserver the slice fields are
# silently dropped; without it on kube-scheduler capacity requests are refused; the
# controller manager reads it only for device-taint eviction.
DRA_GATES = "DRAConsumableCapacity=true"


def apiserver_command(
    binary: Path, layout: Layout, ports: Ports, *, audit: bool = False, node_host: str = ""
) -> list[str]:
    """`node_host`: with real nodes, the bridge address to listen and advertise on."""
    pki = layout.pki
    command = [
        str(binary),
        f"--etcd-servers=http://127.0.0.1:{ports.etcd_client}",
        "--bind-address=127.0.0.1",
        f"--secure-port={ports.apiserver}",
        f"--tls-cert-file={pki.apiserver_cert}",
        f"--tls-private-key-file={pki.apiserver_key}",
        f"--client-ca-file={pki.ca_cert}",
        # Front-proxy authentication, as kubeadm sets it up: without it the
        # controller manager and scheduler log a missing requestheader CA every
        # few seconds, and aggregated API servers could not authenticate users.
        f"--requestheader-client-ca-file={pki.ca_cert}",
        "--requestheader-allowed-names=admin",
        "--requestheader-username-headers=X-Remote-User",
        "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        f"--proxy-client-cert-file={pki.admin_cert}",
        f"--proxy-client-key-file={pki.admin_key}",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={pki.service_account_pub}",
        f"--service-account-signing-key-file={pki.service_account_key}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        # Without the flag the server advertises its default-route address (and
        # fails to start on a host without one); 127.0.0.1 alone is rejected in
        # the `kubernetes` Endpoints, so nothing writes them: no pod here runs
        # a real client that would need them.
        "--advertise-address=127.0.0.1",
        "--endpoint-reconciler-type=none",
        "--authorization-mode=Node,RBAC",
        # The plugin taints every new Node not-ready until the node controller
        # sees it Ready and lifts the taint, one patch per node at ~50/s on
        # 2 cores: 20 s for 1,024 nodes. kwok makes nodes Ready within
        # seconds, and the node controller still taints any node that later
        # turns NotReady or Unknown.
        "--disable-admission-plugins=TaintNodesByCondition",
        "--allow-privileged=true",
        "--enable-priority-and-fairness=false",
        "--max-requests-inflight=2000",
        "--max-mutating-requests-inflight=1000",
        "--delete-collection-workers=4",
        # With WatchList on (the 1.34 default) a watch from resourceVersion ""
        # or "0" is served as a stream of initial events, which needs etcd's
        # RequestWatchProgress (etcd >= 3.5.13). Against etcd 3.5.1 every such
        # watch fails at once: kwok (it always watches from "0") and any
        # client watching without a resourceVersion would re-list in a loop.
        f"--feature-gates=WatchList=false,{DRA_GATES}",
        "--profiling=false",
        *(audit_flags(layout) if audit else []),
    ]
    if not node_host:
        return command
    # Later flags win: these replace the loopback bind and advertise address and
    # the `none` endpoint reconciler above.
    return command + real_node_apiserver_flags(pki, node_host)


def controller_manager_command(
    binary: Path, layout: Layout, ports: Ports, lease_seconds: int = NODE_LEASE_SECONDS
) -> list[str]:
    pki = layout.pki
    kubeconfig = str(layout.kubeconfig)
    return [
        str(binary),
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        f"--secure-port={ports.controller_manager}",
        "--leader-elect=false",
        # Every default controller: garbage collector, namespace, service
        # accounts and their tokens, node lifecycle, job, replicaset, podgc ...
        "--controllers=*",
        # Each controller acts as its own service account, as in real clusters,
        # so RBAC gaps in the default roles show up here too.
        "--use-service-account-credentials=true",
        f"--service-account-private-key-file={pki.service_account_key}",
        f"--root-ca-file={pki.ca_cert}",
        f"--cluster-signing-cert-file={pki.ca_cert}",
        f"--cluster-signing-key-file={pki.ca_key}",
        f"--kube-api-qps={CLIENT_QPS}",
        f"--kube-api-burst={CLIENT_BURST}",
        f"--node-monitor-grace-period={node_monitor_grace(lease_seconds)}",
        "--concurrent-gc-syncs=20",
        "--concurrent-namespace-syncs=10",
        f"--feature-gates={DRA_GATES}",
        "--profiling=false",
    ]


def scheduler_config(layout: Layout) -> dict[str, Any]:
    """KubeSchedulerConfiguration: the deprecated --kubeconfig flag is not needed."""
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {
            "kubeconfig": str(layout.kubeconfig),
            "qps": CLIENT_QPS,
            "burst": CLIENT_BURST,
        },
        "leaderElection": {"leaderElect": False},
    }


def scheduler_command(binary: Path, layout: Layout, ports: Ports) -> list[str]:
    kubeconfig = str(layout.kubeconfig)
    return [
        str(binary),
        f"--config={layout.scheduler_config}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        f"--secure-port={ports.scheduler}",
        f"--feature-gates={DRA_GATES}",
        "--profiling=false",
    ]


def kwok_config() -> dict[str, Any]:
    """KwokConfiguration: options that have no command-line flag."""
    return {
        "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
        "kind": "KwokConfiguration",
        "metadata": {"name": "trainwave"},
        # kwok plays stages with 4 workers by default; 1,024 new nodes then
        # take ~20 s to turn Ready, and a 100-job burst of pods queues too.
        "options": {
            "nodePlayStageParallelism": KWOK_PARALLELISM,
            "podPlayStageParallelism": KWOK_PARALLELISM,
            "nodeLeaseParallelism": KWOK_PARALLELISM,
        },
    }


def kwok_command(
    binary: Path,
    layout: Layout,
    ports: Ports,
    stages: list[Path],
    lease_seconds: int = NODE_LEASE_SECONDS,
) -> list[str]:
    return [
        str(binary),
        f"--kubeconfig={layout.kubeconfig}",
        f"--config={layout.kwok_config}",
        *(f"--config={stage}" for stage in stages),
        # Only the nodes the topology created: a real kubelet (or another kwok)
        # could share the cluster without the two fighting over a node.
        "--manage-all-nodes=false",
        f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}={KWOK_NODE_VALUE}",
        f"--node-ip={NODE_IP}",
        f"--cidr={POD_CIDR}",
        f"--node-lease-duration-seconds={lease_seconds}",
        f"--server-address=127.0.0.1:{ports.kwok}",
    ]


def kwok_environment(layout: Layout, base: dict[str, str]) -> dict[str, str]:
    return base | {
        # kwok also reads ~/.kwok/kwok.yaml when present; a work dir of our own
        # keeps a developer's personal kwok config out of the tests.
        "KWOK_WORKDIR": str(layout.kwok_workdir),
    }
