"""The real nodes' footprint on the host: parts they need, paths they claim, and the undo.

What the kubelet, containerd, runc and CNI leave on a machine (as observed here, see
/work/shared/research/real-node.md) and how `down` removes it: mounts under the kubelet's
root and the node dirs, the `kubepods` cgroups of every v1 controller, the processes in
them, and host directories that did not exist before `up`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cluster.realnode_config import KUBELET_MARKER, KUBELET_ROOT

CGROUP_ROOT = Path("/sys/fs/cgroup")
KUBEPODS = "kubepods"
NODE_CGROUP_PREFIX = "twnode-"  # realnode_config.NodeLayout.cgroup_root
# Host paths a node creates when missing (kubelet, CNI's result cache, `ip netns`, the
# CDI dir for the agent); `down` removes those that did not exist before `up`. containerd
# is configured to leave /run/containerd, /opt/containerd and /run/nri alone.
HOST_PATHS = (
    "/var/lib/kubelet",
    "/var/lib/cni",
    "/run/cdi",
    "/run/netns",
    "/var/log/containers",
    "/run/trainwave",  # the chart's agent: agent.arbiter.hostPath (hostPath DirectoryOrCreate)
)
IMAGE_ARCHIVES = ("pause.tar", "coredns.tar")


def cache_dir() -> Path:
    return Path(os.environ.get("TRAINWAVE_CACHE") or "~/.cache/trainwave").expanduser()


def check_prerequisites() -> None:
    """Fail with what is missing: real nodes need root, iproute2, nsenter and the parts."""
    missing = []
    if os.geteuid() != 0:
        missing.append("root (network namespaces, mounts and cgroups need it)")
    for command in ("ip", "nsenter", "iptables", "mount", "umount", "skopeo", "htpasswd"):
        if shutil.which(command) is None:
            missing.append(f"`{command}` on PATH")
    parts = [images_dir() / name for name in IMAGE_ARCHIVES]
    parts += [cni_bin_dir() / plugin for plugin in ("bridge", "host-local", "loopback")]
    binaries = ("kubelet", "kube-proxy", "containerd", "registry")
    parts += [cache_dir() / "bin" / name for name in binaries]
    for part in parts:
        if not part.exists():
            missing.append(str(part))
    if missing:
        raise RuntimeError(
            "real nodes cannot start, missing: "
            + "; ".join(missing)
            + ". The parts come from `make tools` (tests/cluster/install-tools.sh)."
        )


def claim_kubelet_root(cluster_root: Path) -> None:
    """Refuse a /var/lib/kubelet that another kubelet or cluster owns; mark it ours."""
    owner = kubelet_root_owner()
    if KUBELET_ROOT.exists() and owner != str(cluster_root):
        who = f"the cluster in {owner}" if owner else "something else (no trainwave marker)"
        raise RuntimeError(
            f"{KUBELET_ROOT} exists and belongs to {who}; a real node needs it. Stop that "
            f"cluster (`python -m cluster down` with its TRAINWAVE_CLUSTER_DIR) or remove it"
        )
    busy = [path for path in kubepods_cgroups() if _cgroup_processes(path)]
    if busy:
        raise RuntimeError(f"another kubelet's pods run in {busy[0]}; stop it first")
    KUBELET_ROOT.mkdir(parents=True, exist_ok=True)
    KUBELET_MARKER.write_text(str(cluster_root))


def kubelet_root_owner() -> str:
    try:
        return KUBELET_MARKER.read_text().strip()
    except OSError:
        return ""


def remove_kubelet_root(cluster_root: Path, problems: list[str]) -> None:
    if kubelet_root_owner() not in ("", str(cluster_root)):
        return
    if mounts_under(KUBELET_ROOT):
        problems.append(f"{KUBELET_ROOT} still has mounts; left in place")
        return
    shutil.rmtree(KUBELET_ROOT, ignore_errors=True)
    if KUBELET_ROOT.exists():
        problems.append(f"could not remove {KUBELET_ROOT}")


def missing_paths() -> list[str]:
    return [path for path in HOST_PATHS if not os.path.lexists(path)]


def remove_created_paths(paths: list[str], problems: list[str]) -> None:
    for path in map(Path, paths):
        if path == KUBELET_ROOT or not path.exists():
            continue  # the kubelet root goes in remove_kubelet_root, after its mounts
        if mounts_under(path):
            unmount_under(path, problems)
        shutil.rmtree(path, ignore_errors=True)
        if path.exists():
            problems.append(f"could not remove {path}")


def mounts_under(prefix: Path) -> list[str]:
    """Mount points at or below `prefix`, deepest first."""
    root = str(prefix).rstrip("/")
    found = []
    with open("/proc/self/mountinfo") as mountinfo:
        for line in mountinfo:
            point = _unescape(line.split()[4])
            if point == root or point.startswith(root + "/"):
                found.append(point)
    return sorted(set(found), key=lambda p: p.count("/"), reverse=True)


def unmount_under(prefix: Path, problems: list[str]) -> None:
    for _ in range(5):  # a path mounted several times over needs several passes
        points = mounts_under(prefix)
        if not points:
            return
        for point in points:
            subprocess.run(["umount", "--lazy", point], capture_output=True, check=False)
    left = mounts_under(prefix)
    if left:
        problems.append(f"{len(left)} mount(s) left under {prefix}, e.g. {left[0]}")


def _unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def cgroup_controllers() -> list[Path]:
    """Every mounted cgroup hierarchy, each once (cpu and cpuacct are one hierarchy behind
    two names)."""
    if not CGROUP_ROOT.is_dir():
        return []
    seen: dict[Path, Path] = {}
    for entry in sorted(CGROUP_ROOT.iterdir()):
        if entry.is_dir() and (entry / "cgroup.procs").exists():
            seen.setdefault(entry.resolve(), entry)
    return list(seen.values())


def kubepods_cgroups() -> list[Path]:
    """`kubepods` in every mounted v1 controller hierarchy, at the top for the first node
    and under each further node's cgroup root (`twnode-N`, realnode_mounts.py)."""
    found = []
    for controller in cgroup_controllers():
        found += [controller / KUBEPODS, *controller.glob(f"{NODE_CGROUP_PREFIX}*/{KUBEPODS}")]
    return sorted(path for path in found if path.is_dir())


def _cgroup_processes(path: Path) -> list[int]:
    pids: list[int] = []
    for directory, _, _ in os.walk(path):  # not rglob: cgroups vanish while it walks
        procs = Path(directory) / "cgroup.procs"
        try:
            pids.extend(int(pid) for pid in procs.read_text().split())
        except (OSError, ValueError):
            continue
    return pids


def kill_pod_processes(problems: list[str]) -> None:
    """SIGKILL whatever still runs in the pod cgroups (containers whose shim is gone)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        pids = {pid for path in kubepods_cgroups() for pid in _cgroup_processes(path)}
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
    problems.append("processes still run in the kubepods cgroups after SIGKILL")


def remove_kubepods_cgroups(problems: list[str]) -> None:
    """rmdir every kubepods cgroup bottom-up (a cgroup is removed with rmdir, not rm),
    then the further nodes' cgroup roots."""
    node_roots = [p for c in cgroup_controllers() for p in c.glob(f"{NODE_CGROUP_PREFIX}*")]
    for top in [*kubepods_cgroups(), *sorted(node_roots)]:
        # os.walk, not rglob: runc may remove a container's cgroup while this walks
        # (os.walk skips what vanished; rglob raises).
        directories = [Path(d) for d, _, _ in os.walk(top, topdown=False)]
        for directory in directories or [top]:
            for _ in range(20):
                try:
                    directory.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.05)
        if top.exists():
            problems.append(f"could not remove cgroup {top}")


def containerd_major_version(binary: Path) -> int:
    result = subprocess.run([str(binary), "--version"], capture_output=True, text=True, check=False)
    match = re.search(r"\sv?(\d+)\.(\d+)\.", result.stdout)
    if match is None:
        raise RuntimeError(f"cannot read the version of {binary}: {result.stdout!r}")
    return int(match.group(1))


def runc_binary(tool: Callable[[str], Path]) -> Path:
    return tool("runc")


def cni_bin_dir() -> Path:
    return cache_dir() / "cni" / "bin"


def images_dir() -> Path:
    return cache_dir() / "images"


def pause_archive() -> Path:
    return images_dir() / "pause.tar"


@dataclass(frozen=True)
class ImageArchive:
    path: Path
    ref: str
    key: str  # changes when the archive's content does


def image_archives() -> list[ImageArchive]:
    """The node's own images (pause, CoreDNS) and every image of the `make images`
    manifest ($TRAINWAVE_IMAGES_MANIFEST, else images/manifest.json; missing: none)."""
    archives = []
    for name in IMAGE_ARCHIVES:
        path = images_dir() / name
        if not path.exists():
            raise RuntimeError(f"image archive missing: {path} (built by `make tools`)")
        stat = path.stat()
        archives.append(ImageArchive(path, archive_ref(path), f"{stat.st_size}:{stat.st_mtime_ns}"))
    manifest = Path(os.environ.get("TRAINWAVE_IMAGES_MANIFEST") or images_dir() / "manifest.json")
    if manifest.exists():
        for entry in json.loads(manifest.read_text()).get("images", []):
            path = Path(entry["archive"])
            if not path.is_absolute():
                path = manifest.parent / path
            if not path.exists():
                raise RuntimeError(f"{manifest} lists {path}, which is missing; run `make images`")
            archives.append(ImageArchive(path, str(entry["ref"]), str(entry["key"])))
    return archives


def stale_image_ids(listing: str) -> list[str]:
    """From `ctr images ls` (columns REF, TYPE, DIGEST, ...): the names `sha256:<id>` whose
    image (DIGEST) no other name points to any more."""
    rows = [line.split() for line in listing.splitlines()[1:] if line.strip()]
    named = {row[2] for row in rows if len(row) > 2 and not row[0].startswith("sha256:")}
    return [
        row[0]
        for row in rows
        if len(row) > 2 and row[0].startswith("sha256:") and row[2] not in named
    ]


def archive_ref(archive: Path) -> str:
    """The image reference an OCI archive names in its index (what `ctr import` uses)."""
    with tarfile.open(archive) as tar:
        member = tar.extractfile("index.json")
        if member is None:
            raise RuntimeError(f"{archive} has no index.json: not an OCI image archive")
        index = json.load(member)
    for manifest in index.get("manifests", []):
        ref = (manifest.get("annotations") or {}).get("io.containerd.image.name")
        if ref:
            return str(ref)
    raise RuntimeError(f"{archive}: no io.containerd.image.name annotation in index.json")
