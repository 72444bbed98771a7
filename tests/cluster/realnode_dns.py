"""Cluster DNS on the real nodes: CoreDNS as kind and kubeadm deploy it.

A one-replica Deployment in kube-system pinned to the real nodes (`type=real`: on a kwok
node it would only be simulated), its Corefile in a ConfigMap, the `kube-dns` Service at
the Service range's tenth address (the kubelets' clusterDNS) and the RBAC it needs. The
Corefile answers cluster.local (Services, headless Services' pods, pod A records) and has
no `forward`: no name is resolved off the machine.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

from cluster.api import ApiClient, ApiError
from cluster.realnode_config import CLUSTER_DNS_IP, CLUSTER_DOMAIN, REAL_NODE_TYPE

NAMESPACE = "kube-system"
NAME = "coredns"

COREFILE = f""".:53 {{
    errors
    health {{
        lameduck 2s
    }}
    ready
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 30
    }}
    cache 30
    loop
    reload
    loadbalance
}}
"""


def manifests(image: str) -> list[dict[str, Any]]:
    labels = {"k8s-app": "kube-dns"}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": NAME, "namespace": NAMESPACE}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "system:coredns"},
            "rules": [
                {"apiGroups": [""], "resources": ["endpoints", "services", "pods", "namespaces"],
                 "verbs": ["list", "watch"]},
                {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
                 "verbs": ["list", "watch"]},
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "system:coredns"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": "system:coredns"},
            "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}],
        },
        {"apiVersion": "v1", "kind": "ConfigMap",
         "metadata": {"name": NAME, "namespace": NAMESPACE}, "data": {"Corefile": COREFILE}},
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": NAME, "namespace": NAMESPACE, "labels": labels},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "serviceAccountName": NAME,
                        "priorityClassName": "system-cluster-critical",
                        # No upstream resolver exists; CoreDNS needs none.
                        "dnsPolicy": "Default",
                        "nodeSelector": {"type": REAL_NODE_TYPE},
                        "containers": [{
                            "name": NAME,
                            "image": image,
                            "imagePullPolicy": "Never",
                            "args": ["-conf", "/etc/coredns/Corefile"],
                            "ports": [
                                {"name": "dns", "containerPort": 53, "protocol": "UDP"},
                                {"name": "dns-tcp", "containerPort": 53, "protocol": "TCP"},
                                {"name": "metrics", "containerPort": 9153, "protocol": "TCP"},
                            ],
                            "resources": {"requests": {"cpu": "50m", "memory": "40Mi"},
                                          "limits": {"memory": "170Mi"}},
                            "securityContext": {
                                "allowPrivilegeEscalation": False,
                                "capabilities": {"add": ["NET_BIND_SERVICE"], "drop": ["ALL"]},
                                "readOnlyRootFilesystem": True,
                            },
                            "volumeMounts": [{"name": "config", "mountPath": "/etc/coredns",
                                              "readOnly": True}],
                            "readinessProbe": {"httpGet": {"path": "/ready", "port": 8181},
                                               "periodSeconds": 1},
                            "livenessProbe": {"httpGet": {"path": "/health", "port": 8080},
                                              "initialDelaySeconds": 10},
                        }],
                        "volumes": [{"name": "config", "configMap": {"name": NAME}}],
                    },
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "kube-dns", "namespace": NAMESPACE, "labels": labels},
            "spec": {
                "clusterIP": CLUSTER_DNS_IP,
                "selector": labels,
                "ports": [
                    {"name": "dns", "port": 53, "targetPort": 53, "protocol": "UDP"},
                    {"name": "dns-tcp", "port": 53, "targetPort": 53, "protocol": "TCP"},
                    {"name": "metrics", "port": 9153, "targetPort": 9153, "protocol": "TCP"},
                ],
            },
        },
    ]  # fmt: skip


def apply(kubectl: Path, kubeconfig: Path, images: dict[str, str]) -> None:
    """Create or update the objects; `images` maps archive stems to references."""
    image = images.get("coredns")
    if not image:
        raise RuntimeError("no CoreDNS image archive (coredns.tar) to run cluster DNS from")
    document = yaml.safe_dump_all(manifests(image))
    result = subprocess.run(
        [str(kubectl), f"--kubeconfig={kubeconfig}", "apply", "--server-side",
         "--force-conflicts", "--field-manager=trainwave-cluster", "-f", "-"],
        input=document, capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    if result.returncode != 0:
        raise RuntimeError(f"deploying CoreDNS failed: {result.stderr.strip()}")


def ready(client: ApiClient) -> bool:
    try:
        deployment = client.get(f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{NAME}")
    except (ApiError, OSError):
        return False
    return bool(deployment.get("status", {}).get("readyReplicas"))
