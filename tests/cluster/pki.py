"""The local cluster's certificates and the admin kubeconfig, made with openssl.

Keys are ECDSA P-256: every Kubernetes component accepts them and they are
generated in milliseconds, where RSA would cost a visible part of a cold `up`.
Everything lives under one directory and is thrown away with the cluster.
"""

from __future__ import annotations

import base64
import subprocess
from dataclasses import dataclass
from pathlib import Path

import yaml

# The in-cluster names of the API server, plus loopback: clients here connect
# to 127.0.0.1, pods (if any) would use the service IP or a DNS name.
SERVICE_IP = "10.96.0.1"
_API_SERVER_SANS = (
    "DNS:localhost",
    "DNS:kubernetes",
    "DNS:kubernetes.default",
    "DNS:kubernetes.default.svc",
    "DNS:kubernetes.default.svc.cluster.local",
    "IP:127.0.0.1",
    f"IP:{SERVICE_IP}",
)
_DAYS = "3650"


@dataclass(frozen=True)
class Pki:
    """Paths of the files `make_pki` writes."""

    directory: Path

    @property
    def ca_cert(self) -> Path:
        return self.directory / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.directory / "ca.key"

    @property
    def apiserver_cert(self) -> Path:
        return self.directory / "apiserver.crt"

    @property
    def apiserver_key(self) -> Path:
        return self.directory / "apiserver.key"

    @property
    def admin_cert(self) -> Path:
        return self.directory / "admin.crt"

    @property
    def admin_key(self) -> Path:
        return self.directory / "admin.key"

    @property
    def apiserver_kubelet_client_cert(self) -> Path:
        # What the API server presents to kubelets (logs, exec, port-forward).
        return self.directory / "apiserver-kubelet-client.crt"

    @property
    def apiserver_kubelet_client_key(self) -> Path:
        return self.directory / "apiserver-kubelet-client.key"

    @property
    def service_account_key(self) -> Path:
        return self.directory / "sa.key"

    @property
    def service_account_pub(self) -> Path:
        return self.directory / "sa.pub"


def make_pki(directory: Path, extra_ips: tuple[str, ...] = ()) -> Pki:
    """Create a CA, the API server's serving cert, an admin client cert and the SA key pair.
    `extra_ips` are more addresses the API server is reached at (the real nodes' bridge)."""
    pki = Pki(directory)
    directory.mkdir(parents=True, exist_ok=True)
    _openssl(
        "req", "-x509", "-nodes", "-days", _DAYS,
        "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
        "-keyout", pki.ca_key, "-out", pki.ca_cert,
        "-subj", "/CN=trainwave-local-ca",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,digitalSignature,keyCertSign,cRLSign",
    )  # fmt: skip
    _issue(
        pki,
        pki.apiserver_key,
        pki.apiserver_cert,
        subject="/CN=kube-apiserver",
        usage="serverAuth",
        extra=(
            "-addext",
            "subjectAltName=" + ",".join((*_API_SERVER_SANS, *(f"IP:{ip}" for ip in extra_ips))),
        ),
    )
    # O=system:masters: the group RBAC binds to cluster-admin by default.
    _issue(
        pki, pki.admin_key, pki.admin_cert, subject="/O=system:masters/CN=admin", usage="clientAuth"
    )
    _openssl(
        "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:prime256v1",
        "-out", pki.service_account_key,
    )  # fmt: skip
    _openssl("pkey", "-in", pki.service_account_key, "-pubout", "-out", pki.service_account_pub)
    for key in (pki.ca_key, pki.apiserver_key, pki.admin_key, pki.service_account_key):
        key.chmod(0o600)
    return pki


def issue_client_cert(pki: Pki, key: Path, cert: Path, *, user: str, group: str = "") -> None:
    """A client certificate signed by the cluster CA: CN=`user`, O=`group` (optional)."""
    subject = (f"/O={group}" if group else "") + f"/CN={user}"
    key.parent.mkdir(parents=True, exist_ok=True)
    _issue(pki, key, cert, subject=subject, usage="clientAuth")
    key.chmod(0o600)


def issue_server_cert(pki: Pki, key: Path, cert: Path, *, ips: tuple[str, ...]) -> None:
    """A serving certificate signed by the cluster CA for the addresses `ips`."""
    key.parent.mkdir(parents=True, exist_ok=True)
    sans = "subjectAltName=" + ",".join(f"IP:{ip}" for ip in ips)
    _issue(pki, key, cert, subject=f"/CN={ips[0]}", usage="serverAuth", extra=("-addext", sans))
    key.chmod(0o600)


def write_kubeconfig(
    path: Path,
    server: str,
    pki: Pki,
    cluster_name: str = "trainwave",
    *,
    client: tuple[Path, Path] | None = None,
) -> None:
    """A kubeconfig with everything embedded, so it works when copied elsewhere; the admin
    user unless `client` gives another (certificate, key)."""
    certificate, key = client or (pki.admin_cert, pki.admin_key)

    def embedded(file: Path) -> str:
        return base64.b64encode(file.read_bytes()).decode()

    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": cluster_name,
                "cluster": {
                    "server": server,
                    "certificate-authority-data": embedded(pki.ca_cert),
                },
            }
        ],
        "users": [
            {
                "name": "admin",
                "user": {
                    "client-certificate-data": embedded(certificate),
                    "client-key-data": embedded(key),
                },
            }
        ],
        "contexts": [{"name": cluster_name, "context": {"cluster": cluster_name, "user": "admin"}}],
        "current-context": cluster_name,
        "preferences": {},
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)


def _issue(
    pki: Pki, key: Path, cert: Path, *, subject: str, usage: str, extra: tuple[str, ...] = ()
) -> None:
    # OpenSSL 3 signs a fresh request with the CA in one `req -x509 -CA` call.
    _openssl(
        "req", "-x509", "-nodes", "-days", _DAYS,
        "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
        "-keyout", key, "-out", cert, "-subj", subject,
        "-CA", pki.ca_cert, "-CAkey", pki.ca_key,
        "-addext", "basicConstraints=critical,CA:FALSE",
        "-addext", "keyUsage=critical,digitalSignature",
        "-addext", f"extendedKeyUsage={usage}",
        *extra,
    )  # fmt: skip


def _openssl(*args: str | Path) -> None:
    command = ["openssl", *map(str, args)]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(
            f"openssl failed (exit {result.returncode}): {' '.join(command)}\n{result.stderr}"
        )
