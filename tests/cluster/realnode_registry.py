"""A private image registry beside the real nodes, so images reach them the way a user's
do: pulled over TLS with credentials from an `imagePullSecrets` Secret.

- the server is distribution's `registry` (built by `make tools`, REGISTRY_VERSION in
  install-tools.sh), on the host at `HOST` (the nodes' bridge address: reachable from every
  node's network namespace, from nothing off the machine);
- TLS with a serving certificate from the cluster CA; every node's containerd trusts that CA
  for this host alone (`containerd_hosts`, containerd's hosts.toml; nothing else changes);
- basic auth from an htpasswd file (bcrypt, `htpasswd -B`: distribution reads no other
  hash), user `USER` with a password made per cluster (`credentials`);
- the `make images` archives are copied in by skopeo (Debian's package); its blobs live in
  the tools cache (`storage_dir`), so an archive pushed before with the same content key is
  not pushed again, on a cold `up` too.

A test names an image there with `registry_ref`, e.g. `198.18.0.1:5000/trainwave/runtime:0.1.0`.
"""

from __future__ import annotations

import base64
import json
import secrets
import ssl
import subprocess
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import yaml

from cluster.pki import Pki, issue_server_cert
from cluster.realnode_host import ImageArchive, cache_dir
from cluster.realnode_net import BRIDGE_IP, direct_environment

PORT = 5000
HOST = f"{BRIDGE_IP}:{PORT}"
USER = "trainwave"
PROCESS = "registry"
# Docker Hub's implicit host, which the archives' refs carry (docker.io/trainwave/...).
_DEFAULT_HOST = "docker.io/"


@dataclass(frozen=True)
class RegistryFiles:
    """The registry's files: its settings under the cluster's state dir (`root`), its blobs
    in the tools cache (`storage`)."""

    root: Path
    storage: Path

    @property
    def config(self) -> Path:
        return self.root / "config.yml"

    @property
    def cert(self) -> Path:
        return self.root / "registry.crt"

    @property
    def key(self) -> Path:
        return self.root / "registry.key"

    @property
    def htpasswd(self) -> Path:
        return self.root / "htpasswd"

    @property
    def password(self) -> Path:
        return self.root / "password"

    @property
    def pushed(self) -> Path:
        """{registry ref: {"key": archive content key, "digest": manifest digest}} of what
        is in `storage` already."""
        return self.storage / "pushed.json"


def files(state_root: Path) -> RegistryFiles:
    return RegistryFiles(state_root / "registry", storage_dir())


def storage_dir() -> Path:
    return cache_dir() / "registry"


def registry_ref(ref: str) -> str:
    """`docker.io/trainwave/operator:0.1.0` (or `trainwave/operator:0.1.0`) as this
    registry names it: `198.18.0.1:5000/trainwave/operator:0.1.0`."""
    return f"{HOST}/{ref.removeprefix(_DEFAULT_HOST)}"


def credentials(registry: RegistryFiles) -> tuple[str, str]:
    """(user, password) that pull from and push to the registry."""
    return USER, registry.password.read_text().strip()


def pull_secret(registry: RegistryFiles, name: str, namespace: str) -> dict[str, object]:
    """A `kubernetes.io/dockerconfigjson` Secret for this registry, as `kubectl create secret
    docker-registry` writes it: what a pod's `imagePullSecrets` names."""
    user, password = credentials(registry)
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    config = {"auths": {HOST: {"username": user, "password": password, "auth": token}}}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace},
        "type": "kubernetes.io/dockerconfigjson",
        "data": {".dockerconfigjson": base64.b64encode(json.dumps(config).encode()).decode()},
    }


def pushed_digest(registry: RegistryFiles, ref: str) -> str:
    """The manifest digest `ref` (a `registry_ref`) was last pushed with; "" if never."""
    try:
        entry = json.loads(registry.pushed.read_text()).get(ref) or {}
    except (OSError, ValueError):
        return ""
    return str(entry.get("digest", "")) if isinstance(entry, dict) else ""


def prepare(registry: RegistryFiles, pki: Pki) -> None:
    """Write the serving certificate, a fresh password with its htpasswd line and the
    registry's config."""
    registry.root.mkdir(parents=True, exist_ok=True)
    registry.storage.mkdir(parents=True, exist_ok=True)
    issue_server_cert(pki, registry.key, registry.cert, ips=(BRIDGE_IP,))
    password = secrets.token_urlsafe(18)
    registry.password.write_text(password + "\n")
    registry.password.chmod(0o600)
    hashed = subprocess.run(
        ["htpasswd", "-nbB", USER, password], capture_output=True, text=True, check=True, timeout=30
    ).stdout.strip()
    registry.htpasswd.write_text(hashed + "\n")
    registry.config.write_text(yaml.safe_dump(registry_config(registry), sort_keys=False))


def registry_config(registry: RegistryFiles) -> dict[str, object]:
    """distribution v3's configuration (docs/content/about/configuration.md upstream)."""
    return {
        "version": 0.1,
        "log": {"level": "info", "accesslog": {"disabled": True}},
        "storage": {
            "filesystem": {"rootdirectory": str(registry.storage / "data")},
            "delete": {"enabled": True},
        },
        "http": {
            "addr": HOST,
            "tls": {"certificate": str(registry.cert), "key": str(registry.key)},
        },
        "auth": {"htpasswd": {"realm": "trainwave-local", "path": str(registry.htpasswd)}},
    }


def command(binary: Path, registry: RegistryFiles) -> list[str]:
    return [str(binary), "serve", str(registry.config)]


def collect_garbage(binary: Path, registry: RegistryFiles) -> str:
    """Delete what no tag names any more, before the server starts (distribution collects
    offline): each rebuilt image pushed under its tag leaves the old manifest and layers
    behind (the first collection here took the storage from 192 to 126 MB, after a few
    rebuilds, in 0.06 s). Returns the error, "" when it went well; a failure leaves the
    blobs and is no reason not to start."""
    result = subprocess.run(
        [str(binary), "garbage-collect", "--delete-untagged", str(registry.config)],
        capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    return "" if result.returncode == 0 else (result.stderr or result.stdout).strip()[-2000:]


def answers(ca_cert: Path) -> bool:
    """True once the registry serves its API: `GET /v2/` answers 401 without credentials."""
    context = ssl.create_default_context(cafile=str(ca_cert))
    direct = urllib.request.build_opener(  # no proxy, whatever the environment says
        urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context)
    )
    try:
        direct.open(f"https://{HOST}/v2/", timeout=2)
    except urllib.error.HTTPError as error:
        return error.code == 401
    except OSError:
        return False
    return False  # it must ask for credentials


def push_images(registry: RegistryFiles, ca_cert: Path, archives: list[ImageArchive]) -> None:
    """Copy each archive into the registry under `registry_ref(ref)` unless the same content
    is there already."""
    try:
        pushed = json.loads(registry.pushed.read_text())
    except (OSError, ValueError):
        pushed = {}
    user, password = credentials(registry)
    certs = registry.root / "certs.d"  # skopeo reads every *.crt of --dest-cert-dir
    certs.mkdir(exist_ok=True)
    (certs / "ca.crt").write_bytes(ca_cert.read_bytes())
    digest_file = registry.root / "digest"
    for archive in archives:
        target = registry_ref(archive.ref)
        known = pushed.get(target)
        if (
            isinstance(known, dict)
            and known.get("key") == archive.key
            and _present(target, certs, user, password)
        ):
            continue
        result = subprocess.run(
            ["skopeo", "copy", "--quiet", f"--dest-cert-dir={certs}",
             f"--dest-creds={user}:{password}", f"--digestfile={digest_file}",
             f"docker-archive:{archive.path}", f"docker://{target}"],
            capture_output=True, text=True, check=False, timeout=900, env=direct_environment(),
        )  # fmt: skip
        if result.returncode != 0:
            raise RuntimeError(
                f"pushing {archive.path} to {target} failed: {result.stderr.strip()}"
            )
        pushed[target] = {"key": archive.key, "digest": digest_file.read_text().strip()}
        registry.pushed.write_text(json.dumps(pushed, indent=2))


def _present(target: str, certs: Path, user: str, password: str) -> bool:
    """The registry still has `target` (its storage may have been emptied by hand)."""
    result = subprocess.run(
        ["skopeo", "inspect", "--raw", f"--cert-dir={certs}", f"--creds={user}:{password}",
         f"docker://{target}"],
        capture_output=True, text=True, check=False, timeout=60, env=direct_environment(),
    )  # fmt: skip
    return result.returncode == 0


def containerd_hosts(hosts_dir: Path, ca_cert: Path) -> None:
    """containerd's per-registry settings (`config_path`, docs/hosts.md upstream): pull
    from `HOST` over HTTPS, trusting the cluster CA for it alone."""
    directory = hosts_dir / HOST
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "hosts.toml").write_text(
        f'server = "https://{HOST}"\n\n'
        f'[host."https://{HOST}"]\n'
        '  capabilities = ["pull", "resolve"]\n'
        f'  ca = "{ca_cert}"\n'
    )
