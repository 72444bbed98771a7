"""`make images`: build trainwave's container images with buildah, cached by content.

What it builds (containerd's normalised references; the tag is the chart's appVersion,
read from charts/trainwave/Chart.yaml, so the chart's default image names need no pull):

  docker.io/trainwave/python:3.11-bookworm  the base: Debian bookworm minbase with its python3
                                            (3.11), pip and venv, made here with mmdebstrap;
                                            Docker Hub's python:3.11-slim-bookworm is not
                                            reachable from this machine. Passed to the
                                            Dockerfiles as PYTHON_IMAGE; also the worker
                                            image of the real-node e2e tests.
  docker.io/trainwave/operator:<tag>        images/operator.Dockerfile
  docker.io/trainwave/agent:<tag>           images/agent.Dockerfile
  docker.io/trainwave/runtime:<tag>         images/runtime.Dockerfile

Outputs, under $TRAINWAVE_CACHE (default ~/.cache/trainwave):

  images/<name>.tar     a docker-archive (the `docker save` layout) whose RepoTags hold the
                        reference: `ctr -n k8s.io images import images/operator.tar` imports
                        it as docker.io/trainwave/operator:<tag>.
  images/manifest.json  what other code reads to import the images, base first:
                          {"format": 1,
                           "images": [{"name": "operator",
                                       "ref": "docker.io/trainwave/operator:0.1.0",
                                       "archive": "/root/.cache/trainwave/images/operator.tar",
                                       "size": 61234176,
                                       "key": "sha256:<64 hex>"}, ...]}
                        name: python, operator, agent or runtime; archive: an absolute path;
                        size: the archive's bytes (its layers are uncompressed, so this is the
                        image's size); key: the content key of the image's inputs (below).
  containers/           buildah's storage (--root, --runroot) and temporary files; nothing is
                        left in /var/lib/containers or /run/containers. Each build stage
                        before the last is tagged localhost/trainwave-build/<name>-<stage>:cache
                        and, after a build, untagged images are pruned: the storage stays about
                        1 GiB, and the layer with the installed dependencies stays cached.

Cache by content: an image is rebuilt only when its key changes. The base's key covers its
recipe (suite, sources, packages, dpkg filters, hooks, image config); an image's key covers
its Dockerfile, every file of the build context that .dockerignore lets through (so
pyproject.toml, README.md and operator/), the build arguments and the base's key. A warm run
hashes those files and exits. `--force` rebuilds anyway (say, for Debian's security updates).

Needs root (mmdebstrap's root mode and buildah's chroot isolation); installs buildah and
mmdebstrap with apt-get when they are missing. RUN steps use the host's network, for pip.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# The build context's rules live beside this script; tests load this file by its path.
sys.path.insert(0, str(Path(__file__).resolve().parent))

from build_context import context_digest, ignore_rules, is_ignored  # noqa: E402

__all__ = ["context_digest", "ignore_rules", "is_ignored"]  # also this script's API to tests
CACHE = Path(os.environ.get("TRAINWAVE_CACHE", Path.home() / ".cache" / "trainwave"))
IMAGES_DIR = CACHE / "images"
MANIFEST = IMAGES_DIR / "manifest.json"
STORAGE = CACHE / "containers"
MANIFEST_FORMAT = 1
# Bump when a build step changes in a way the hashed inputs do not show.
RECIPE_VERSION = 1
# Root on ext4/xfs mounts overlay natively; vfs works anywhere but copies every layer.
STORAGE_DRIVER = os.environ.get("TRAINWAVE_STORAGE_DRIVER", "overlay")

HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")

BASE_NAME = "python"
BASE_REF = "docker.io/trainwave/python:3.11-bookworm"
APP_NAMES = ("operator", "agent", "runtime")

# The base recipe. Its python3 is 3.11 (bookworm's); security updates come with the sources.
SUITE = "bookworm"
SOURCES = (
    "deb http://deb.debian.org/debian bookworm main",
    "deb http://deb.debian.org/debian bookworm-updates main",
    "deb http://deb.debian.org/debian-security bookworm-security main",
)
# python-is-python3: `python` on PATH, as in the official image. python3-venv: the
# Dockerfiles' `python -m venv`. python3-pip: the runtime Dockerfile's system `pip install`.
PACKAGES = ("python3", "python3-venv", "python3-pip", "python-is-python3", "ca-certificates")
# No man pages, info, docs (copyright files stay: the licences travel with the binaries)
# or translations.
DPKG_OPTIONS = (
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/locale/*",
    "path-include=/usr/share/locale/locale.alias",
)
# Debian marks its interpreter EXTERNALLY-MANAGED (PEP 668), which makes a plain
# `pip install` refuse; the official python image has no such marker, and the runtime
# Dockerfile installs at system level. Cache files are left out of the image.
CUSTOMIZE_HOOKS = (
    'rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED',
    'rm -rf "$1"/var/cache/debconf/*-old "$1"/var/lib/dpkg/*-old "$1"/var/log/*.log',
)
# merged /usr without the usrmerge package (which drags in perl, ~50 MB).
MMDEBSTRAP_HOOK_DIR = "/usr/share/mmdebstrap/hooks/merged-usr"
BASE_CONFIG = (
    ("--env", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"),
    ("--env", "LANG=C.UTF-8"),
    ("--cmd", "python3"),
    ("--label", "org.opencontainers.image.title=trainwave-python"),
    ("--label", "org.opencontainers.image.description=Debian bookworm minbase with python3 3.11"),
)


@dataclass(frozen=True)
class Built:
    """One image as the manifest records it."""

    name: str
    ref: str
    archive: str
    size: int
    key: str


# ---- pure parts --------------------------------------------------------------------------


def chart_app_version(chart_yaml: str) -> str:
    """The `appVersion` of a Chart.yaml text: the images' tag."""
    match = re.search(r"^appVersion:\s*[\"']?([^\"'\s#]+)", chart_yaml, re.MULTILINE)
    if not match:
        raise ValueError("Chart.yaml has no appVersion line; the image tag is read from it")
    return match.group(1)


def app_ref(name: str, tag: str) -> str:
    return f"docker.io/trainwave/{name}:{tag}"


def content_key(parts: Mapping[str, bytes]) -> str:
    """sha256 over named parts, order-independent, with lengths so no two inputs collide."""
    digest = hashlib.sha256()
    for name in sorted(parts):
        value = parts[name]
        digest.update(f"{name}\0{len(value)}\0".encode())
        digest.update(value)
    return "sha256:" + digest.hexdigest()


def base_key() -> str:
    recipe = {
        "suite": SUITE,
        "sources": SOURCES,
        "packages": PACKAGES,
        "dpkg": DPKG_OPTIONS,
        "hooks": CUSTOMIZE_HOOKS,
        "hook_dir": MMDEBSTRAP_HOOK_DIR,
        "config": BASE_CONFIG,
        "recipe": RECIPE_VERSION,
    }
    return content_key({"base": json.dumps(recipe, sort_keys=True).encode()})


def app_key(
    dockerfile: bytes, context: bytes, build_args: Mapping[str, str], base: str, ref: str
) -> str:
    return content_key(
        {
            "dockerfile": dockerfile,
            "context": context,
            "build_args": json.dumps(dict(build_args), sort_keys=True).encode(),
            "base": base.encode(),
            "ref": ref.encode(),
            "recipe": str(RECIPE_VERSION).encode(),
        }
    )


def earlier_stages(dockerfile: str) -> list[str]:
    """Names of the `FROM ... AS name` stages before the last FROM (the image itself)."""
    froms = re.findall(r"^\s*FROM\s+\S+(?:\s+AS\s+(\S+))?", dockerfile, re.I | re.M)
    return [name for name in froms[:-1] if name]


def stage_ref(name: str, stage: str) -> str:
    return f"localhost/trainwave-build/{name}-{stage}:cache"


def render_manifest(images: Iterable[Built]) -> str:
    body = {"format": MANIFEST_FORMAT, "images": [vars(image) for image in images]}
    return json.dumps(body, indent=2) + "\n"


def parse_manifest(text: str) -> dict[str, Built]:
    """The manifest's images by name; an unknown format reads as empty (everything rebuilds)."""
    try:
        body = json.loads(text)
    except ValueError:
        return {}
    if not isinstance(body, dict) or body.get("format") != MANIFEST_FORMAT:
        return {}
    return {entry["name"]: Built(**entry) for entry in body.get("images", [])}


def is_current(built: Built | None, key: str) -> bool:
    """Recorded with this key, and its archive still there, whole."""
    if built is None or built.key != key:
        return False
    archive = Path(built.archive)
    return archive.is_file() and archive.stat().st_size == built.size


# ---- the build context -------------------------------------------------------------------


# ---- running the tools -------------------------------------------------------------------


def run(cmd: list[str], env: Mapping[str, str] | None = None) -> None:
    print("+ " + " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, env=env)


def ensure_tools(commands: Mapping[str, str]) -> None:
    """apt-get install the packages of missing commands ({command: package}), as root."""
    missing = sorted({pkg for cmd, pkg in commands.items() if shutil.which(cmd) is None})
    if not missing:
        return
    if os.geteuid() != 0:
        sys.exit(f"images: {', '.join(missing)} missing; install them (apt-get install) as root")
    # Wait for dpkg's lock rather than fail: .ci/run builds the tools, which may install
    # the real node's packages, at the same time.
    apt = ["apt-get", "-o", "DPkg::Lock::Timeout=600"]
    install = [*apt, "install", "-y", "--no-install-recommends", *missing]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    if subprocess.run(install, env=env, check=False).returncode != 0:
        run([*apt, "update"], env=env)  # a fresh machine has no package lists yet
        run(install, env=env)


def buildah(
    *args: str, capture: bool = False, check: bool = True
) -> subprocess.CompletedProcess[str]:
    cmd = [
        "buildah",
        "--root", str(STORAGE / "storage"),
        "--runroot", str(STORAGE / "run"),
        "--storage-driver", STORAGE_DRIVER,
        *args,
    ]  # fmt: skip
    if capture:
        return subprocess.run(cmd, check=check, text=True, capture_output=True)
    print("+ buildah " + " ".join(args), flush=True)
    return subprocess.run(cmd, check=check, text=True)


def in_storage(ref: str) -> bool:
    return buildah("inspect", "--type", "image", ref, capture=True, check=False).returncode == 0


def export(ref: str, name: str, key: str) -> Built:
    """Write `ref` as a docker-archive next to the manifest (atomically) and describe it."""
    archive = IMAGES_DIR / f"{name}.tar"
    partial = archive.with_suffix(".tar.partial")
    partial.unlink(missing_ok=True)
    buildah("push", "--quiet", ref, f"docker-archive:{partial}:{ref}")
    partial.replace(archive)
    return Built(name, ref, str(archive), archive.stat().st_size, key)


def build_base(key: str) -> Built:
    rootfs = STORAGE / "tmp" / "base-rootfs.tar"
    rootfs.unlink(missing_ok=True)
    mmdebstrap = ["mmdebstrap", "--variant=minbase", f"--hook-dir={MMDEBSTRAP_HOOK_DIR}"]
    mmdebstrap += [f"--include={','.join(PACKAGES)}"]
    mmdebstrap += [f"--dpkgopt={option}" for option in DPKG_OPTIONS]
    mmdebstrap += [f"--customize-hook={hook}" for hook in CUSTOMIZE_HOOKS]
    run([*mmdebstrap, SUITE, str(rootfs), *SOURCES])
    # The container runtime provides /dev; device nodes in a layer would only shadow it.
    run(["tar", "--delete", "--wildcards", "-f", str(rootfs), "./dev/?*"])
    container = buildah("from", "scratch", capture=True).stdout.strip()
    try:
        buildah("add", container, str(rootfs), "/")
        buildah("config", *[arg for pair in BASE_CONFIG for arg in pair], container)
        buildah("commit", "--quiet", container, BASE_REF)
    finally:
        buildah("rm", container, capture=True, check=False)
        rootfs.unlink(missing_ok=True)
    return export(BASE_REF, BASE_NAME, key)


def build_app(name: str, ref: str, key: str, build_args: Mapping[str, str]) -> Built:
    dockerfile = REPO / "images" / f"{name}.Dockerfile"
    args = ["bud", "--layers", "--pull=never", "--isolation", "chroot", "--network", "host"]
    # A failed step would otherwise keep its container, mounted, in the storage.
    args.append("--force-rm")
    if HOST_CA_BUNDLE.is_file():
        # Where TLS to the package index goes through an intercepting proxy, the host trusts
        # its CA and the base does not: lend RUN steps the host's bundle (Debian's pip reads
        # this path). A build-time mount only; the image keeps Debian's own bundle.
        args += ["--volume", f"{HOST_CA_BUNDLE}:{HOST_CA_BUNDLE}:ro"]
    for arg, value in build_args.items():
        args += ["--build-arg", f"{arg}={value}"]
    args += ["-f", str(dockerfile)]
    # Each earlier stage built and tagged first (the full build below then reuses it): a
    # tag keeps its layers, the dependencies' among them, through `prune`.
    for stage in earlier_stages(dockerfile.read_text()):
        buildah(*args, "--target", stage, "-t", stage_ref(name, stage), str(REPO))
    buildah(*args, "-t", ref, str(REPO))
    return export(ref, name, key)


def prune() -> None:
    """Drop the images a rebuild left untagged (about 200 MiB per image and source change).

    What a tag reaches stays: the images, the base and each build stage's newest state,
    so the layer cache keeps the installed dependencies.
    """
    buildah("rmi", "--prune", capture=True, check=False)


# buildah 1.28 writes its blob-info cache to /var/lib/containers/cache whatever --root says,
# and its network backend creates /run/containers/networks even with --network host.
HOST_TRACES = (Path("/var/lib/containers"), Path("/run/containers"))


@contextlib.contextmanager
def no_host_traces(paths: Iterable[Path] = HOST_TRACES) -> Iterator[None]:
    """Remove what buildah creates outside the cache, when it was not there before us."""
    created = [path for path in paths if not path.exists()]
    try:
        yield
    finally:
        for path in created:
            shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """One build at a time per cache: a second `make images` waits for the first."""
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def build(names: Iterable[str], force: bool) -> list[Built]:
    """Build what changed among `names` (the base always considered first); returns all known."""
    tag = chart_app_version((REPO / "charts" / "trainwave" / "Chart.yaml").read_text())
    known = parse_manifest(MANIFEST.read_text()) if MANIFEST.exists() else {}
    build_args = {"PYTHON_IMAGE": BASE_REF}
    context = context_digest(REPO)
    wanted = [name for name in APP_NAMES if name in set(names)]

    def record(built: Built) -> None:
        known[built.name] = built
        order = [BASE_NAME, *APP_NAMES]
        MANIFEST.with_suffix(".partial").write_text(
            render_manifest(known[n] for n in order if n in known)
        )
        MANIFEST.with_suffix(".partial").replace(MANIFEST)

    def report(label: str, step: Mapping[str, object]) -> None:
        print(f"==> {label}: {step}", flush=True)

    built_any = False
    base = base_key()
    if force or not is_current(known.get(BASE_NAME), base):
        started = time.monotonic()
        record(build_base(base))
        report(BASE_NAME, {"built in s": round(time.monotonic() - started, 1)})
        built_any = True
        # A rebuilt base has new layers (newer packages) under the same recipe key.
        force = True
    else:
        report(BASE_NAME, {"up to date": BASE_REF})
    for name in wanted:
        ref = app_ref(name, tag)
        dockerfile = (REPO / "images" / f"{name}.Dockerfile").read_bytes()
        key = app_key(dockerfile, context, build_args, base, ref)
        if not force and is_current(known.get(name), key):
            report(name, {"up to date": ref})
            continue
        if not in_storage(BASE_REF):  # storage wiped, archive kept: load it, no rebuild
            buildah("pull", f"docker-archive:{known[BASE_NAME].archive}")
        started = time.monotonic()
        record(build_app(name, ref, key, build_args))
        report(name, {"built in s": round(time.monotonic() - started, 1)})
        built_any = True
    if built_any:
        prune()
    return [known[n] for n in [BASE_NAME, *APP_NAMES] if n in known]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", default=list(APP_NAMES), help="operator agent runtime")
    parser.add_argument("--force", action="store_true", help="rebuild even if the inputs match")
    args = parser.parse_args(argv)
    unknown = set(args.names) - set(APP_NAMES)
    if unknown:
        parser.error(f"unknown image {sorted(unknown)}; known: {', '.join(APP_NAMES)}")
    if os.geteuid() != 0:
        sys.exit("images: needs root (mmdebstrap's root mode, buildah's chroot isolation)")
    ensure_tools({"buildah": "buildah", "mmdebstrap": "mmdebstrap"})
    for directory in (IMAGES_DIR, STORAGE / "tmp"):
        directory.mkdir(parents=True, exist_ok=True)
    # buildah and mmdebstrap put large temporary files in TMPDIR: keep them in the cache.
    os.environ["TMPDIR"] = str(STORAGE / "tmp")
    started = time.monotonic()
    try:
        with locked(IMAGES_DIR / ".lock"), no_host_traces():
            images = build(args.names, args.force)
    except subprocess.CalledProcessError as failed:
        # The tool's own output above says why; what was built before it is kept.
        command = " ".join(map(str, failed.cmd))
        print(f"images: failed with exit code {failed.returncode}: {command[:300]}\n"
              f"{MANIFEST} lists what is built", file=sys.stderr)  # fmt: skip
        return 1
    for image in images:
        print(f"{image.ref:45} {image.size / 2**20:7.1f} MiB  {image.archive}")
    print(f"manifest: {MANIFEST} ({time.monotonic() - started:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
