"""Kueue's manager beside the local control plane: out of cluster, against its API server.

    manager = start_kueue(cluster, workdir)   # CRDs installed, manager ready
    manager.stop()

The binary and its CRDs come from the tools cache (install-tools.sh kueue). What
running outside the cluster takes, in Kueue v0.11.9 (cmd/kueue/main.go):

- internal certificate management off: it fills an in-cluster Secret and waits
  for kubelet to mount it into the pod, which never happens here;
- so the webhook server and the metrics server load certificate files: a
  self-signed pair serves both (the metrics directory through the one-line
  patch install-tools.sh explains). The webhook server listens on loopback,
  and no webhook configuration is installed, so the API server never calls it:
  the CRDs' schemas and CEL rules still validate every object;
- VisibilityOnDemand off (it needs an in-cluster config); no leader election.

TAS stays off: trainwave places gangs itself, Kueue is a quota and priority gate.
"""

from __future__ import annotations

import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import yaml

from cluster import processes
from cluster.controlplane import Cluster, cache_dir
from cluster.deploy import free_port

KUEUE_VERSION = "v0.11.9"
START_TIMEOUT = 60.0
# The CRDs the tests and the operator use; the others (e.g. Topology) come along.
CORE_CRDS = ("workloads", "clusterqueues", "localqueues", "resourceflavors")


def kueue_home() -> Path:
    return cache_dir() / f"kueue-{KUEUE_VERSION}"


@dataclass
class KueueManager:
    record: processes.ProcessRecord
    health_port: int
    log: Path

    def ready(self) -> bool:
        try:
            url = f"http://127.0.0.1:{self.health_port}/readyz"
            with urllib.request.urlopen(url, timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def stop(self) -> None:
        processes.stop_groups([self.record.pid], 5.0)

    def tail(self, lines: int = 20) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def install_crds(cluster: Cluster) -> None:
    """Server-side: the Workload CRD is too large for client-side apply's annotation."""
    home = kueue_home()
    if not (home / "bin" / "kueue").exists():
        raise FileNotFoundError(f"no Kueue in {home}; run `make tools` (install-tools.sh kueue)")
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(home / "crd"))
    names = [f"crd/{plural}.kueue.x-k8s.io" for plural in CORE_CRDS]
    # `kubectl wait` fails at once on a CRD the API server does not list yet (the large
    # Workload CRD can take seconds after the apply returns): wait for it to exist first.
    cluster.kubectl("wait", "--for=create", "--timeout=60s", *names)
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", *names)


def start_kueue(cluster: Cluster, workdir: Path) -> KueueManager:
    install_crds(cluster)
    workdir.mkdir(parents=True, exist_ok=True)
    certs = workdir / "certs"
    _self_signed(certs)
    health = free_port()
    config = {
        "apiVersion": "config.kueue.x-k8s.io/v1beta1",
        "kind": "Configuration",
        "namespace": "kueue-system",
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health}"},
        "metrics": {"bindAddress": "0"},
        "webhook": {"port": free_port(), "host": "127.0.0.1", "certDir": str(certs)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "integrations": {
            "frameworks": ["batch/job"],
            # Marks TrainingJob as a Kueue-managed parent; trainwave owns its Workload.
            "externalFrameworks": ["TrainingJob.v1alpha1.trainwave.io"],
        },
        "featureGates": {"VisibilityOnDemand": False},
    }
    config_path = workdir / "kueue-config.yaml"
    config_path.write_text(yaml.safe_dump(config))
    cluster.kubectl("create", "namespace", "kueue-system", check=False)
    log = workdir / "kueue.log"
    argv = [
        str(kueue_home() / "bin" / "kueue"),
        f"--config={config_path}",
        f"--kubeconfig={cluster.kubeconfig}",
        "--zap-log-level=2",
    ]
    environment = {"PATH": "/usr/bin:/bin", "KUEUE_METRICS_CERT_DIR": str(certs)}
    record = processes.spawn("kueue", argv, log, workdir, environment)
    manager = KueueManager(record, health, log)
    deadline = time.monotonic() + START_TIMEOUT
    while not manager.ready():
        if not processes.is_alive(record.pid):
            raise RuntimeError(f"kueue exited: {manager.tail()}")
        if time.monotonic() > deadline:
            manager.stop()
            raise TimeoutError(f"kueue not ready after {START_TIMEOUT}s: {manager.tail()}")
        time.sleep(0.3)
    return manager


def _self_signed(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["openssl", "req", "-x509", "-nodes", "-days", "2",
         "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-keyout", str(directory / "tls.key"), "-out", str(directory / "tls.crt"),
         "-subj", "/CN=kueue-webhook-service.kueue-system.svc",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
