"""The local Kubernetes control plane the integration tests and demos run against.

`python -m cluster {up,down,status,env}` from tests/, or from Python:
`ensure_cluster(topology) -> Cluster`, `stop_cluster()`, `cluster_status()`.
"""

from cluster.controlplane import (
    DEFAULT_TOPOLOGY,
    Cluster,
    ClusterStatus,
    cluster_status,
    default_state_dir,
    ensure_cluster,
    stop_cluster,
)

__all__ = [
    "DEFAULT_TOPOLOGY",
    "Cluster",
    "ClusterStatus",
    "cluster_status",
    "default_state_dir",
    "ensure_cluster",
    "stop_cluster",
]
