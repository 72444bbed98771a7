"""Kueue's manager beside the local control plane: out of cluster, against its API server.

    manager = start_kueue(cluster, workdir)   # CRDs installed, manager ready
    manager.stop()

The binary and its CRDs come from the tools cache (install-tools.sh kueue), at
KUEUE_VERSION: v0.17.0, or the version in $TRAINWAVE_KUEUE_VERSION (v0.11.9 is the
other one tested; build it with `TRAINWAVE_KUEUE_VERSION=v0.11.9 install-tools.sh
kueue`). What running outside the cluster takes, in Kueue v0.11.9 and v0.17.0
(cmd/kueue/main.go):

- internal certificate management off: it fills an in-cluster Secret and waits
  for kubelet to mount it into the pod, which never happens here;
- so the webhook server and the metrics server load certificate files: a
  self-signed pair serves both (the metrics directory through the one-line
  patch install-tools.sh explains). The webhook server listens on loopback,
  where the API server (a host process here) calls it: once the manager is
  ready, the admission webhooks and the CRDs' conversion webhook are installed
  as Kueue's release manifests install them, with a URL for the Service
  (kueue_webhooks.py), and `stop` removes them first: with `failurePolicy:
  Fail` and no manager, every pod create would be refused;
- VisibilityOnDemand off (it needs an in-cluster config); no leader election.

TAS stays off here (no Topology object): trainwave places gangs itself, Kueue is a quota
and priority gate. The saturation benchmark's Kueue peer (tests/benchmarks/saturation_kueue.py)
turns it on for its own batch Jobs.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from cluster import kueue_webhooks, processes
from cluster.controlplane import Cluster, cache_dir
from cluster.deploy import free_port

DEFAULT_KUEUE_VERSION = "v0.17.0"  # install-tools.sh builds the same by default
KUEUE_VERSION = os.environ.get("TRAINWAVE_KUEUE_VERSION", DEFAULT_KUEUE_VERSION)
START_TIMEOUT = 60.0
CRD_TIMEOUT = 60.0
# The CRDs the tests and the operator use; the others (e.g. Topology) come along.
CORE_CRDS = ("workloads", "clusterqueues", "localqueues", "resourceflavors")


def kueue_home() -> Path:
    return cache_dir() / f"kueue-{KUEUE_VERSION}"


@dataclass
class KueueManager:
    record: processes.ProcessRecord
    health_port: int
    log: Path
    # "kueue.x-k8s.io/v1beta2" from Kueue v0.15 on, "kueue.x-k8s.io/v1beta1" before:
    # the API server's preferred version of the group, the one the operator chooses.
    api_version: str
    cluster: Cluster
    converted: tuple[str, ...] = ()  # CRDs whose conversion was pointed at the manager

    def ready(self) -> bool:
        try:
            url = f"http://127.0.0.1:{self.health_port}/readyz"
            with urllib.request.urlopen(url, timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def stop(self) -> None:
        remove_webhooks(self.cluster, self.converted)
        processes.stop_groups([self.record.pid], 5.0)

    def tail(self, lines: int = 20) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def install_crds(cluster: Cluster) -> None:
    """Server-side: the Workload CRD is too large for client-side apply's annotation."""
    home = kueue_home()
    if not (home / "bin" / "kueue").exists():
        build = f"TRAINWAVE_KUEUE_VERSION={KUEUE_VERSION} tests/cluster/install-tools.sh kueue"
        if KUEUE_VERSION == DEFAULT_KUEUE_VERSION:
            build = "make tools"
        raise FileNotFoundError(f"no Kueue {KUEUE_VERSION} in {home}; run `{build}`")
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(home / "crd"))
    names = [f"crd/{plural}.kueue.x-k8s.io" for plural in CORE_CRDS]
    # `kubectl wait` fails at once on a CRD the API server does not list yet (the large
    # Workload CRD can take seconds after the apply returns; once, on a cluster started
    # moments before, the Established wait failed at once right after a --for=create
    # wait had passed): asked again until the deadline, and its own words on failure.
    deadline = time.monotonic() + CRD_TIMEOUT
    while True:
        waited = cluster.kubectl(
            "wait", "--for=condition=Established", "--timeout=10s", *names, check=False
        )
        if waited.returncode == 0:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"Kueue {KUEUE_VERSION}'s CRDs not Established after {CRD_TIMEOUT:.0f}s: "
                f"{waited.stderr.strip() or waited.stdout.strip()}"
            )
        time.sleep(1.0)


def preferred_version(cluster: Cluster) -> str:
    """The group's preferred version as discovery lists it (the newest served)."""
    group = json.loads(cluster.kubectl("get", "--raw", "/apis/kueue.x-k8s.io").stdout)
    return str(group["preferredVersion"]["groupVersion"])


def start_kueue(
    cluster: Cluster, workdir: Path, extra_configuration: dict[str, Any] | None = None
) -> KueueManager:
    """`extra_configuration`: top-level fields added to the manager's Configuration
    (the saturation benchmark's peer sets waitForPodsReady)."""
    install_crds(cluster)
    workdir.mkdir(parents=True, exist_ok=True)
    certs = workdir / "certs"
    _self_signed(certs)
    health, webhook_port = free_port(), free_port()
    config = {
        "apiVersion": "config.kueue.x-k8s.io/v1beta1",
        "kind": "Configuration",
        "namespace": "kueue-system",
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health}"},
        "metrics": {"bindAddress": "0"},
        "webhook": {"port": webhook_port, "host": "127.0.0.1", "certDir": str(certs)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "integrations": {
            "frameworks": ["batch/job"],
            # Marks TrainingJob as a Kueue-managed parent; trainwave owns its Workload.
            "externalFrameworks": ["TrainingJob.v1alpha1.trainwave.io"],
        },
        "featureGates": {"VisibilityOnDemand": False},
    } | (extra_configuration or {})
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
    manager = KueueManager(record, health, log, preferred_version(cluster), cluster)
    deadline = time.monotonic() + START_TIMEOUT
    while not manager.ready():
        if not processes.is_alive(record.pid):
            raise RuntimeError(f"kueue exited: {manager.tail()}")
        if time.monotonic() > deadline:
            manager.stop()
            raise TimeoutError(f"kueue not ready after {START_TIMEOUT}s: {manager.tail()}")
        time.sleep(0.3)
    try:
        manager.converted = install_webhooks(cluster, f"https://127.0.0.1:{webhook_port}", certs)
    except BaseException:
        manager.stop()
        raise
    return manager


def install_webhooks(cluster: Cluster, base_url: str, certs: Path) -> tuple[str, ...]:
    """Kueue's admission and conversion webhooks, calling the manager at `base_url`; the
    CRDs whose conversion now goes through it. Waits until the API server calls them."""
    home, ca = kueue_home(), (certs / "tls.crt").read_bytes()
    if not (home / "webhook" / "manifests.yaml").exists():
        raise FileNotFoundError(f"no Kueue webhook manifests in {home}; run `make tools`")
    configurations = kueue_webhooks.admission_configurations(home, base_url, ca)
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-",
                    input="\n---\n".join(json.dumps(c) for c in configurations))  # fmt: skip
    converted = tuple(kueue_webhooks.converted_crds(home))
    patch = json.dumps({"spec": {"conversion": kueue_webhooks.conversion(base_url, ca)}})
    for name in converted:
        cluster.kubectl("patch", "crd", name, "--type=merge", "-p", patch)
    _wait_for_webhooks(cluster)
    return converted


def remove_webhooks(cluster: Cluster, converted: tuple[str, ...]) -> None:
    for configuration in _CONFIGURATIONS:
        cluster.kubectl("delete", configuration, "--ignore-not-found", check=False)
    none = json.dumps({"spec": {"conversion": {"strategy": "None", "webhook": None}}})
    for name in converted:
        cluster.kubectl("patch", "crd", name, "--type=merge", "-p", none, check=False)


_CONFIGURATIONS = (
    f"mutatingwebhookconfiguration/{kueue_webhooks.NAME_PREFIX}mutating-webhook-configuration",
    f"validatingwebhookconfiguration/{kueue_webhooks.NAME_PREFIX}validating-webhook-configuration",
)


def _wait_for_webhooks(cluster: Cluster) -> None:
    """Until the API server calls the validating webhook: a ClusterQueue with a negative
    nominal quota passes the CRD's schema and is refused by Kueue's webhook alone
    (pkg/webhooks/clusterqueue_webhook.go). A server-side dry run: nothing is stored."""
    probe = {
        "apiVersion": preferred_version(cluster),
        "kind": "ClusterQueue",
        "metadata": {"name": "webhook-probe"},
        "spec": {"resourceGroups": [{"coveredResources": ["cpu"], "flavors": [
            {"name": "probe", "resources": [{"name": "cpu", "nominalQuota": "-1"}]}]}]},
    }  # fmt: skip
    deadline = time.monotonic() + CRD_TIMEOUT
    while True:
        answer = cluster.kubectl("create", "--dry-run=server", "-f", "-",
                                 input=json.dumps(probe), check=False)  # fmt: skip
        if answer.returncode != 0 and "vclusterqueue.kb.io" in answer.stderr:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"Kueue's webhooks not called after {CRD_TIMEOUT:.0f}s: "
                f"{answer.stderr.strip() or answer.stdout.strip()}"
            )
        time.sleep(0.5)


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
